"""Task registration: importing this module registers ``resnmt_translation``."""
from resnmt.tasks.translation import ResNMTTranslationConfig, ResNMTTranslationTask  # noqa: F401
