"""segtrain: train segmentation networks from polygon annotations."""

from segtrain.image_limits import limit_opencv_decoder

limit_opencv_decoder()  # before anything imports cv2: OpenCV reads its limit once, when it loads

__version__ = "0.1.0"
