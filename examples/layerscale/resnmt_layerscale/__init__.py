"""LayerScale as a resnmt connection kind (``--residual layerscale``): see connection.py."""
