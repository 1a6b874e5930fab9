"""The registry HTTP API (distribution v2) through requests: is a tag there and which digest
does it name, a repository's tags, deleting a manifest (a failed push's roll-back), whether a
registry answers at all, and moving blobs and manifests (OCI artifacts, wheelshare.py).

Authentication as docker does it, with docker's stored credentials (dockerauth.py): on a 401
a `Basic` challenge gets the stored login; a `Bearer` challenge sends it (or nothing, for
anonymous pulls) to the token service named in the challenge and retries with the token.
Timeouts come from the network policy (netpolicy.py).

Nothing a registry says about content is taken on its word (docs/trust.md): a manifest's
digest is the sha256 of the bytes it served (a `Docker-Content-Digest` header that disagrees
is refused, DigestMismatch), a manifest asked for by digest must hash to it, and every digest
this client puts into a URL has passed digests.checked. What fails is said as what it is:
the network (RegistryUnreachable, exit 3), authentication (RegistryAuthRefused, exit 4), this
machine's disk (DiskProblem, exit 5); a blob's bytes that cannot be decoded are the caller's
to name (exit 6, errors.DecodeProblem).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from mtpimage import netpolicy
from mtpimage.errors import EXIT_AUTH, DiskProblem, EnvironmentProblem
from mtpimage.imageref import Registry, base_url
from mtpimage.publish import digests, dockerauth

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)


def network_reason(exc: BaseException) -> str:
    """What failed, in a few words, from a requests/urllib3 exception (whose own text is a
    nest of pool, retry and connection object reprs)."""
    import requests  # lazy: ~60 ms, only needed when a registry is involved

    text = str(exc)
    low = text.lower()
    if isinstance(exc, requests.exceptions.SSLError):
        m = re.search(r"\[SSL: [A-Z_]+\] ([^(\"')]+)", text)
        return f"TLS failed ({(m.group(1) if m else 'certificate or protocol error').strip()})"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return "no answer to the connection attempt (timed out)"
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return "connected, but no answer in time (timed out)"
    for needles, what in (
        (
            (
                "nameresolutionerror",
                "name or service not known",
                "failed to resolve",
                "temporary failure in name resolution",
                "nodename nor servname",
            ),
            "its host name does not resolve (DNS)",
        ),
        (("connection refused",), "connection refused (nothing listens there)"),
        (("network is unreachable", "no route to host"), "no network route to it"),
        (
            ("remotedisconnected", "connection aborted", "connection reset", "broken pipe"),
            "the connection was closed without an answer",
        ),
        (("proxyerror", "unable to connect to proxy"), "the HTTP proxy refused or failed"),
    ):
        if any(n in low for n in needles):
            return what
    m = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return m.group(1).strip() if m else type(exc).__name__


class RegistryUnreachable(EnvironmentProblem):
    def __init__(self, host: str, what: str, exc: BaseException):
        self.reason = network_reason(exc)
        super().__init__(
            f"registry {host} cannot be reached: {self.reason} ({what}) (fix: check that the "
            f"registry runs and that {base_url(host)}/v2/ answers from this machine (DNS, proxy, "
            "firewall), or use another --registry)"
        )


class RegistryHTTPError(EnvironmentProblem):
    """The registry answered, with a status that is not the one asked for."""

    def __init__(self, message: str, status: int):
        self.status = status
        super().__init__(message)


class RegistryAuthRefused(RegistryHTTPError):
    """HTTP 401/403: the registry answered and refused this machine's credentials (or their
    absence). Its own exit code: a login fixes it, retrying does not."""

    exit_code = EXIT_AUTH


class DigestMismatch(EnvironmentProblem):
    """The registry named a digest that is not the sha256 of the bytes it served."""

    ASKED = "the digest asked for"  # `source` when the bytes served for a digest are others

    def __init__(self, host: str, what: str, said: str, computed: str, source: str):
        self.said, self.computed, self.source = said, computed, source
        super().__init__(
            f"registry {host} says {what} is {said} ({source}), but the manifest it served is "
            f"{computed} (the sha256 of its bytes); refused: nothing was tagged, pinned or written "
            "(fix: use a registry, or a proxy in front of it, that serves manifests unchanged)"
        )


def transient(exc: BaseException) -> bool:
    """Worth asking again (the network policy's retries): a connection that failed for a
    reason that can pass, or a registry answering 5xx or 429. Never TLS or DNS failures."""
    if isinstance(exc, RegistryUnreachable):
        return not exc.reason.startswith(("TLS", "its host name does not resolve"))
    return isinstance(exc, RegistryHTTPError) and (exc.status >= 500 or exc.status == 429)


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = (header or "").strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


class RegistryClient:
    """Look-ups in one registry, authenticated with docker's stored login for its host."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.host = registry.host
        self.base_url = registry.base_url
        self._auth_header: dict[str, str] = {}  # what the last challenge asked for, reused

    def _credentials(self):
        return dockerauth.credentials(self.host)

    def _answer(self, challenge: str, scope: str) -> dict[str, str] | None:
        """Headers answering a 401's WWW-Authenticate, or None when there is no answer."""
        import requests  # lazy: ~60 ms, only needed when a registry is involved

        scheme, fields = _challenge(challenge)
        creds = self._credentials()
        if scheme == "basic":
            if creds is None:
                return None
            token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
            return {"Authorization": f"Basic {token}"}
        if scheme != "bearer" or not fields.get("realm"):
            return None
        realm = fields["realm"]
        params = {"service": fields.get("service", ""), "scope": fields.get("scope") or scope}
        try:
            resp = requests.get(
                realm,
                params=params,
                timeout=netpolicy.http_timeout(),
                auth=(creds.username, creds.password) if creds else None,
            )
        except requests.RequestException as exc:
            raise RegistryUnreachable(self.host, f"token service {realm}", exc) from None
        if resp.status_code != 200:
            return None
        try:
            body = resp.json()
        except ValueError:
            return None
        token = body.get("token") or body.get("access_token")
        return {"Authorization": f"Bearer {token}"} if token else None

    def _request(
        self,
        method: str,
        path: str,
        what: str,
        scope: str,
        headers: dict | None = None,
        *,
        body: bytes | Path | None = None,
        params: dict | None = None,
        stream: bool = False,
    ):
        """One request, answering a 401 once. `path` is under the registry's base URL, or a
        URL the registry gave (an upload's Location); credentials go only to the registry's
        own host. A Path body is re-opened for each send, so the 401's retry sends it whole."""
        import requests  # lazy: ~60 ms, only needed when a registry is involved

        url = urljoin(self.base_url + "/", path)
        ours = urlsplit(url).netloc == urlsplit(self.base_url).netloc
        headers = dict(headers or {})

        def send(auth: dict[str, str]):
            data = body.open("rb") if isinstance(body, Path) else body
            try:
                return requests.request(
                    method,
                    url,
                    headers={**headers, **auth},
                    data=data,
                    params=params,
                    stream=stream,
                    timeout=netpolicy.http_timeout(),
                )
            finally:
                if isinstance(body, Path):
                    data.close()

        try:
            resp = send(self._auth_header if ours else {})
            if resp.status_code == 401 and ours:
                answer = self._answer(resp.headers.get("WWW-Authenticate", ""), scope)
                if answer:
                    resp.close()
                    self._auth_header = answer
                    resp = send(answer)
        except requests.RequestException as exc:
            raise RegistryUnreachable(self.host, what, exc) from None
        return resp

    def manifest_digest(self, repository: str, tag: str) -> str | None:
        """Digest of repository:tag in the registry, or None when the tag does not exist:
        the sha256 of the manifest's bytes (a GET, never a HEAD's header alone); a
        Docker-Content-Digest header that names another digest is refused (DigestMismatch)."""
        got = self.manifest(repository, tag)
        return None if got is None else got[1]

    def tags(self, repository: str) -> list[str]:
        path = self.registry.repo_path(repository)
        what = f"listing the tags of {self.registry.ref(repository)}"
        resp = self._request("GET", f"/v2/{path}/tags/list", what, f"repository:{path}:pull")
        if resp.status_code == 404:
            return []
        if resp.status_code != 200:
            raise self._http_error(resp.status_code, what)
        return sorted(resp.json().get("tags") or [])

    def delete_manifest(self, repository: str, digest: str) -> bool:
        """Delete a manifest by digest (which removes every tag naming it); True when gone."""
        path = self.registry.repo_path(repository)
        digest = digests.checked(digest, f"registry {self.host}: a manifest digest to delete")
        resp = self._request(
            "DELETE",
            f"/v2/{path}/manifests/{digest}",
            f"deleting {self.registry.ref(repository)}@{digest}",
            f"repository:{path}:delete",
        )
        return resp.status_code in (200, 202, 404)

    # -- blobs and manifests (pushing and pulling OCI artifacts) ----------------------------
    def blob_exists(self, repository: str, digest: str) -> bool:
        path = self.registry.repo_path(repository)
        digest = digests.checked(digest, f"registry {self.host}: a blob digest")
        what = f"looking up blob {digest} in {self.registry.ref(repository)}"
        resp = self._request("HEAD", f"/v2/{path}/blobs/{digest}", what, f"repository:{path}:pull")
        if resp.status_code == 404:
            return False
        if resp.status_code != 200:
            raise self._http_error(resp.status_code, what)
        return True

    def upload_blob(self, repository: str, digest: str, body: bytes | Path) -> None:
        """The monolithic upload: POST opens an upload session, one PUT carries every byte and
        names the digest, which the registry checks before it accepts the blob."""
        path = self.registry.repo_path(repository)
        digest = digests.checked(digest, f"a blob digest to upload to {self.host}")
        scope = f"repository:{path}:pull,push"
        what = f"uploading blob {digest} to {self.registry.ref(repository)}"
        resp = self._request("POST", f"/v2/{path}/blobs/uploads/", what, scope)
        location = resp.headers.get("Location")
        if resp.status_code != 202 or not location:
            raise self._http_error(resp.status_code, what)
        resp = self._request(
            "PUT",
            location,
            what,
            scope,
            {"Content-Type": "application/octet-stream"},
            body=body,
            params={"digest": digest},  # requests appends it to the Location's own query
        )
        if resp.status_code != 201:
            raise self._http_error(resp.status_code, what)

    def fetch_blob(self, repository: str, digest: str, out, max_bytes: int) -> tuple[str, int]:
        """Stream a blob into the binary file `out` (emptied first, so a retry starts over);
        stop after max_bytes + 1 bytes. Returns (the digest of what came, in `digest`'s
        algorithm, and its size): the caller compares both with what it asked for.

        Only a failure of the transfer is a network error (RegistryUnreachable, retried by the
        network policy). `out` failing to take the bytes is this machine's disk (DiskProblem);
        anything else `out` raises (a decompressing sink's decode error) passes unchanged,
        for the caller to name: it is neither the network nor the disk."""
        import requests  # lazy: ~60 ms, only needed when a registry is involved

        path = self.registry.repo_path(repository)
        digest = digests.checked(
            digest, f"registry {self.host}: a blob digest of {self.registry.ref(repository)}"
        )
        what = f"downloading blob {digest} from {self.registry.ref(repository)}"
        out.seek(0)
        out.truncate()
        resp = self._request(
            "GET", f"/v2/{path}/blobs/{digest}", what, f"repository:{path}:pull", stream=True
        )
        with resp:
            if resp.status_code != 200:
                raise self._http_error(resp.status_code, what)
            h, size = digests.hasher(digest), 0
            chunks = resp.iter_content(1 << 20)
            while size <= max_bytes:
                try:
                    chunk = next(chunks, None)
                except requests.RequestException as exc:  # a cut transfer (requests wraps urllib3's)
                    raise RegistryUnreachable(self.host, what, exc) from None
                if chunk is None:
                    break
                h.update(chunk)
                size += len(chunk)
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise DiskProblem(what, getattr(out, "name", None), exc) from None
        return f"{digest.split(':', 1)[0]}:{h.hexdigest()}", size

    def manifest(
        self, repository: str, reference: str, accept: str = MANIFEST_TYPES, *, check_header: bool = True
    ) -> tuple[bytes, str] | None:
        """(the manifest's bytes, their digest) for a tag or digest, or None when there is none.
        The digest is computed from the bytes, never taken from a header: a manifest asked
        for by digest must hash to it, and a Docker-Content-Digest header that names another
        digest is refused (DigestMismatch; `check_header=False` only for a roll-back, which
        must still find what it pushed)."""
        path = self.registry.repo_path(repository)
        if ":" in reference:  # tags have no colon: this is a digest, perhaps one a registry gave
            reference = digests.checked(reference, f"registry {self.host}: a manifest digest")
        what = (
            f"reading manifest {self.registry.ref(repository)}{'@' if ':' in reference else ':'}{reference}"
        )
        resp = self._request(
            "GET", f"/v2/{path}/manifests/{reference}", what, f"repository:{path}:pull", {"Accept": accept}
        )
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._http_error(resp.status_code, what)
        body = resp.content
        computed = digests.of(body, reference if ":" in reference else "sha256:")
        named = self.registry.ref(repository) + ("@" if ":" in reference else ":") + reference
        if ":" in reference and computed != reference:
            raise DigestMismatch(self.host, named, reference, computed, DigestMismatch.ASKED)
        said = resp.headers.get("Docker-Content-Digest")
        if check_header and said:
            source = "its Docker-Content-Digest header"
            if not digests.valid(said):
                raise DigestMismatch(self.host, named, digests.excerpt(said), computed, source)
            if digests.of(body, said) != said:
                raise DigestMismatch(self.host, named, said, digests.of(body, said), source)
        return body, computed

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str) -> str:
        """PUT a manifest under a tag; returns its digest (of exactly these bytes)."""
        path = self.registry.repo_path(repository)
        what = f"pushing manifest {self.registry.ref(repository)}:{reference}"
        resp = self._request(
            "PUT",
            f"/v2/{path}/manifests/{reference}",
            what,
            f"repository:{path}:pull,push",
            {"Content-Type": media_type},
            body=body,
        )
        if resp.status_code != 201:
            detail = " ".join(resp.text.split())[:200]
            raise self._http_error(resp.status_code, f"{what}: {detail}" if detail else what)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        said = resp.headers.get("Docker-Content-Digest")
        if said and said != digest:
            said = said if digests.valid(said) else digests.excerpt(said)
            raise EnvironmentProblem(
                f"registry {self.host} stored manifest {self.registry.ref(repository)}:{reference} as {said}, "
                f"not as the pushed bytes' {digest} (fix: use a registry that keeps manifests as pushed)"
            )
        return digest

    def referrers(self, repository: str, digest: str) -> list[dict] | None:
        """The descriptors the OCI 1.1 referrers API lists for a manifest, or None where the
        registry has no such API (it answers 404 there: distribution 2.8, most older ones)."""

        path = self.registry.repo_path(repository)
        digest = digests.checked(digest, f"a manifest digest whose referrers {self.host} lists")
        what = f"listing the referrers of {self.registry.ref(repository)}@{digest}"
        resp = self._request(
            "GET",
            f"/v2/{path}/referrers/{digest}",
            what,
            f"repository:{path}:pull",
            {"Accept": "application/vnd.oci.image.index.v1+json"},
        )
        if resp.status_code != 200:
            return None
        try:
            manifests = json.loads(resp.content).get("manifests")
        except (ValueError, AttributeError):
            return None  # a 200 that is not an index: not the API either
        return manifests if isinstance(manifests, list) else None

    def _http_error(self, status: int, what: str) -> RegistryHTTPError:
        if status in (401, 403):
            return RegistryAuthRefused(
                f"registry {self.host} answered HTTP {status} ({what}): authentication refused (fix: "
                f"docker login {self.host}, or use a registry this machine may read)",
                status,
            )
        if status >= 500:
            fix = "the registry itself failed: check its logs, or retry later"
        else:
            fix = f"check that {self.base_url} is a Docker registry (HTTP API v2)"
        return RegistryHTTPError(f"registry {self.host} answered HTTP {status} ({what}) (fix: {fix})", status)


def answers(host: str, timeout: float = 5) -> None:
    """Raise RegistryUnreachable unless something answers at host's /v2/ (any HTTP status:
    a 401 still means the registry is there)."""
    import requests  # lazy: ~60 ms, only needed when a registry is involved

    try:
        requests.get(f"{base_url(host)}/v2/", timeout=timeout)
    except requests.RequestException as exc:
        raise RegistryUnreachable(host, "GET /v2/", exc) from None
