"""External callbacks over HTTP: the signed receiver and what its callers need.

Include ``awa_django.urls`` in the project's URLs, set ``AWA["CALLBACK_KEYS"]``, and an
external system resolves or extends a job's wait with a signed request to
``POST <prefix>/callbacks/<callback_id>/`` (docs/callbacks.md)::

    from awa_django.callbacks import callback_path, sign_request

    path = callback_path(ctx.callback_id)              # in the handler: where to call back
    body = b'{"result": {"paid": true}}'               # on the calling side
    headers = sign_request(callback_id, body, path=path, key=KEY)
"""

from __future__ import annotations

import uuid

from awa_django.callbacks.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign_request

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "callback_path", "sign_request"]


def callback_path(callback_id: uuid.UUID | str) -> str:
    """The URL path of the receiver for ``callback_id`` (``reverse("awa_django:callback")``):
    needs ``awa_django.urls`` included in the project's URLs."""
    from django.urls import reverse

    return reverse("awa_django:callback", args=[str(callback_id)])
