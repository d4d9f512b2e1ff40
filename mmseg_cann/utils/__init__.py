"""Small shared utilities."""
from .fallbacks import fallback_counts, record_fallback, reset_fallbacks

__all__ = ['record_fallback', 'fallback_counts', 'reset_fallbacks']
