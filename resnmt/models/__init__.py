"""Model registration: importing this package registers resnmt_transformer and its archs."""
