"""Image files: safe reading, header checks before decoding, and decoding on the CPU or the device."""
