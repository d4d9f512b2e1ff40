"""Small shared utilities."""
from .fallbacks import call_site, fallback_counts, fallback_sites, record_fallback, reset_fallbacks

__all__ = ['record_fallback', 'fallback_counts', 'fallback_sites', 'reset_fallbacks', 'call_site']
