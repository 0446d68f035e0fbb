"""Placeholder until the normalized activations land (NReLU / NSwish)."""


def add_normalized_activation_args(parser) -> None:
    """No flags yet."""


def normalized_activation_from_cfg(cfg, side, layer_index, num_layers):
    return None


def normalized_activation_defaults(args) -> None:
    """No flags yet."""


def validate_normalized_activation_args(args) -> None:
    """No flags yet."""
