"""A web view of the parking lots and the delay chain, with replay and purge.

Run it with ``delayed-retry web``, mount :func:`create_app` in an aiohttp
application, or :func:`asgi_app` in an ASGI one (Starlette, FastAPI). Needs
the ``web`` extra (``pip install 'delayed-retry[web]'``).
See ``docs/web.md`` for what it shows, its JSON API and its threat model.
"""

from delayed_retry.web.app import create_app
from delayed_retry.web.asgi import asgi_app
from delayed_retry.web.records import filter_from_mapping, filter_to_mapping
from delayed_retry.web.settings import Credentials, WebSettings, parse_credentials

__all__ = [
    # the application
    "create_app",
    "asgi_app",
    "WebSettings",
    "Credentials",
    "parse_credentials",
    # the page's filter names <-> delayed_retry.parking.lot.ParkedFilter
    "filter_from_mapping",
    "filter_to_mapping",
]
