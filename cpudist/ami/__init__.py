"""The bootstrap script images are baked from (`cpudist ami build`)."""
