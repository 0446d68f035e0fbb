"""Importing this package registers ``resnmt_transformer`` and its named architectures."""
from resnmt.models.resnmt_transformer import ResidualTransformerModel  # noqa: F401
from resnmt.models import architectures  # noqa: F401
