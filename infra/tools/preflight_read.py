"""The reader `park preflight` asks Google's APIs with: the user's application-default
credentials, read from their file only (never google.auth.default(), which would ask a GCE
metadata server), and requests with bounded timeouts and bounded pagination. Read-only: GETs.

google-auth and requests are what the `preflight` extra pins (pyproject.toml); imported when
the command runs, never by `park` itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.tools.preflight import Answer, adc_file

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
TIMEOUT_S = (5.0, 20.0)  # connect, read: one API call
MAX_PAGES = 20  # a list longer than this is cut short, and the report says so
PAGE_SIZE = 500


class NoCredentials(RuntimeError):
    """No application-default credentials on this machine: one line, no traceback."""


def credentials(env: Mapping[str, str] | None = None, home: Path | None = None) -> Any:
    """The user's application-default credentials, from their file; NoCredentials without."""
    env = os.environ if env is None else env
    path = adc_file(env, Path.home() if home is None else home)
    if not path.is_file():
        raise NoCredentials(
            f"no application-default credentials at {path}: run `gcloud auth "
            "application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)"
        )
    try:
        import google.auth
        from google.auth.exceptions import GoogleAuthError
    except ImportError:
        raise NoCredentials(
            "google-auth is not installed: pip install 'park-gke[preflight]'"
        ) from None
    try:
        creds, _ = google.auth.load_credentials_from_file(str(path), scopes=list(SCOPES))
    except (GoogleAuthError, ValueError, OSError) as err:
        raise NoCredentials(f"cannot read the credentials at {path}: {err}") from None
    return creds


class Reader:
    """GETs with one authorized session; each answer an Answer, never an exception."""

    def __init__(self, creds: Any) -> None:
        from google.auth.transport.requests import AuthorizedSession

        self.session = AuthorizedSession(creds)

    def get(self, url: str, params: Mapping[str, Any] | None = None) -> Answer:
        import requests
        from google.auth.exceptions import GoogleAuthError

        try:
            response = self.session.get(url, params=dict(params or {}), timeout=TIMEOUT_S)
        except (requests.RequestException, GoogleAuthError) as err:
            return Answer(0, {"error": {"message": f"{type(err).__name__}: {err}"}})
        try:
            body = response.json()
        except (ValueError, json.JSONDecodeError):
            body = {}
        return Answer(response.status_code, body if isinstance(body, dict) else {})

    def list_all(self, url: str, key: str) -> tuple[Answer, bool]:
        """Every item of a paged list under `key`, at most MAX_PAGES pages; (answer, cut)."""
        items: list[Any] = []
        token = ""
        for _ in range(MAX_PAGES):
            params = {"pageSize": PAGE_SIZE} | ({"pageToken": token} if token else {})
            answer = self.get(url, params)
            if answer.status != 200:
                return answer, False
            items += answer.body.get(key) or []
            token = str(answer.body.get("nextPageToken") or "")
            if not token:
                return Answer(200, {key: items}), False
        return Answer(200, {key: items}), True
