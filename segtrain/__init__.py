"""segtrain: train segmentation networks from polygon annotations."""

from segtrain.core import moved_modules
from segtrain.runtime.image_limits import limit_opencv_decoder

limit_opencv_decoder()  # before anything imports cv2: OpenCV reads its limit once, when it loads
moved_modules.install()  # `import segtrain.distributed` and the other old paths keep working

__version__ = "0.1.0"
