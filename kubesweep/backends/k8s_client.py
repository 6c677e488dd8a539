"""The Kubernetes API client every part of kubesweep talks through: loaded from a kubeconfig or the in-cluster
config, with a connection pool sized for the write threads and watches, requests that connect within seconds
(an API server that is down or hung is an error, not a hang), and errors in one line of the server's or the
network's words.

`Api` is what a backend holds of it: the API groups it uses in one namespace, `call` (errors in one line) and
`write`, the one path of every write request, counted and passed through a `WriteGuard` (none for a backend used
directly; the operator's checks the leader Lease around each write).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from kubesweep.backends.base import BackendError

# HTTP connections kept per API client: the backends' write threads (8), their watches and reads
CONNECTIONS = 32
# A request without a timeout of its own waits this long for its connection (TCP and TLS) to the API server, and a
# failed connection is tried once more: an API server that is down or hung is an error within seconds, not a hang.
# Reading the answer stays unbounded (watches and `logs --follow` are long reads by design).
CONNECT_TIMEOUT_S = 5.0
CONNECT_RETRIES = 1


def import_client() -> Any:
    try:
        import kubernetes
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise BackendError("the kubernetes backend needs the k8s extra: pip install 'kubesweep[k8s]'") from exc
    return kubernetes


def api_message(exc: Any) -> str:
    """The API server's `message` of an error answer (a Status object), else its reason; at most 1,000 chars."""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, TypeError, AttributeError):
        message = ""
    message = message or str(getattr(exc, "reason", "") or "")
    return message if len(message) <= 1000 else message[:1000] + " ..."


def api_error(exc: Any) -> str:
    try:
        body = json.loads(exc.body)
        return f"{body.get('reason', exc.reason)}: {body.get('message', '')}"
    except (TypeError, ValueError):
        return f"{exc.status} {exc.reason}"


def require_configuration(kubeconfig: str | Path | None) -> bool:
    """Whether a kubeconfig file names the cluster (else the in-cluster configuration does); `BackendError` when
    neither does. Reads no file and asks no server: what `submit` says before anything else about a sweep."""
    have_file = bool(kubeconfig or Path("~/.kube/config").expanduser().exists() or _env_kubeconfig())
    if not have_file and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise BackendError("no Kubernetes cluster configured: no kubeconfig (--kubeconfig, $KUBECONFIG or "
                           "~/.kube/config) and not in a pod; point --kubeconfig at a cluster, or run the sweep on "
                           "this machine with --backend local")
    return have_file


def load_config(k8s: Any, kubeconfig: str | Path | None) -> tuple[Any, str | None]:
    """An API client from the kubeconfig (flag, $KUBECONFIG, ~/.kube/config) or the in-cluster config, with a
    connection pool of `CONNECTIONS` (the client's default, five per CPU, is smaller than the write threads plus
    the watches: every request past it opened a new TLS connection)."""
    config = k8s.client.Configuration()
    have_file = require_configuration(kubeconfig)
    try:
        if have_file:
            path = str(kubeconfig) if kubeconfig else None
            _, context = k8s.config.list_kube_config_contexts(config_file=path)
            k8s.config.load_kube_config(config_file=path, client_configuration=config)
            namespace = context.get("context", {}).get("namespace")
        else:
            k8s.config.load_incluster_config(client_configuration=config)
            path_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            namespace = path_ns.read_text().strip() if path_ns.exists() else None
    except (k8s.config.ConfigException, OSError) as exc:
        raise BackendError(f"no usable Kubernetes configuration (kubeconfig or in-cluster): {exc}") from None
    config.connection_pool_maxsize = CONNECTIONS
    config.retries = _retries()
    return _bounded_client(k8s)(configuration=config), namespace


def _retries() -> Any:
    """urllib3's default retries (3), of which `CONNECT_RETRIES` for a connection that failed."""
    from urllib3.util.retry import Retry

    return Retry(total=3, connect=CONNECT_RETRIES, read=CONNECT_RETRIES)


def _bounded_client(k8s: Any) -> Any:
    """The API client class whose requests without a timeout of their own connect within `CONNECT_TIMEOUT_S`."""

    class BoundedApiClient(k8s.client.ApiClient):  # type: ignore[misc,name-defined]
        def call_api(self, *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("_request_timeout"):
                kwargs["_request_timeout"] = (CONNECT_TIMEOUT_S, None)
            return super().call_api(*args, **kwargs)

    return BoundedApiClient


def unreachable(exc: BaseException, host: str) -> str:
    """One line for a request that never reached the API server: its URL (from the kubeconfig) and why, e.g.
    `cannot reach the Kubernetes API at https://127.0.0.1:6443: connection refused`."""
    return f"cannot reach the Kubernetes API at {host}: {_unreachable_reason(exc)}"


def _unreachable_reason(exc: BaseException) -> str:
    from urllib3 import exceptions as u3

    if isinstance(exc, u3.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    chain += [a for e in list(chain) for a in e.args if isinstance(a, BaseException)]
    if any(isinstance(e, TimeoutError) and "handshake" in str(e) for e in chain):
        return f"it took the connection but gave no TLS handshake within {CONNECT_TIMEOUT_S:g} s (is it hung?)"
    if isinstance(exc, u3.ReadTimeoutError):
        return "it did not answer in time (read timed out)"
    # (urllib3's NewConnectionError, a refused connection among others, is a ConnectTimeoutError by inheritance)
    timed_out = isinstance(exc, u3.ConnectTimeoutError) and not isinstance(exc, u3.NewConnectionError)
    if timed_out or any(isinstance(e, TimeoutError) for e in chain):
        return f"no connection within {CONNECT_TIMEOUT_S:g} s (is it up, and is this its address?)"
    for e in chain:
        if isinstance(e, ssl.SSLCertVerificationError):
            return f"its TLS certificate is not trusted ({e.verify_message})"
        if isinstance(e, ssl.SSLError):
            return f"TLS failed ({e.reason or e})"
    for e in chain:
        if isinstance(e, socket.gaierror):
            return f"cannot resolve its host name ({e.strerror})"
    for e in chain:
        if isinstance(e, OSError) and e.errno:
            return os.strerror(e.errno).lower()
    if isinstance(exc, u3.ProtocolError):
        return "the connection was closed before an answer came"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _env_kubeconfig() -> bool:
    return bool(os.environ.get("KUBECONFIG"))


class WriteGuard(Protocol):
    """Decides whether a write request may go out, around each one."""

    def before(self) -> Mapping[str, Any]:
        """Raise to refuse the write; else the request's extra options (e.g. its `_request_timeout`)."""
        ...

    def after(self) -> None:
        """Raise when no further write may follow (the request returned or failed)."""
        ...


class NoGuard:
    """Every write goes out (a backend used directly)."""

    def before(self) -> Mapping[str, Any]:
        return {}

    def after(self) -> None:
        return None


class Api:
    """The API groups a backend uses in `namespace`, with `call` and the guarded `write`."""

    def __init__(self, api_client: Any, namespace: str, *, guard: WriteGuard | None = None):
        k8s = import_client()
        self.client = api_client
        self.namespace = namespace
        self.core = k8s.client.CoreV1Api(api_client)
        self.batch = k8s.client.BatchV1Api(api_client)
        self.custom = k8s.client.CustomObjectsApi(api_client)
        self.ApiException: type[Exception] = k8s.client.exceptions.ApiException
        self.guard: WriteGuard = guard or NoGuard()
        self.writes = 0  # write requests made, for benchmarks and the operator's step log

    @classmethod
    def connect(cls, namespace: str | None, kubeconfig: str | Path | None = None, *, api_client: Any = None,
                guard: WriteGuard | None = None) -> Api:
        """An `Api` for `api_client`, or for the kubeconfig's (or in-cluster) client; the namespace defaults to
        the context's, then `default`."""
        context_namespace = None
        if api_client is None:
            api_client, context_namespace = load_config(import_client(), kubeconfig)
        return cls(api_client, namespace or context_namespace or "default", guard=guard)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A request; an error answer is a `BackendError` in one line, except 404, raised as it came."""
        try:
            return fn(*args, **kwargs)
        except self.ApiException as exc:
            if getattr(exc, "status", None) == 404:
                raise
            raise BackendError(api_error(exc)) from None
        except Exception as exc:
            if isinstance(exc, BackendError):
                raise
            raise BackendError(unreachable(exc, self.client.configuration.host)) from None

    def write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Every write request goes through here: the guard is asked before (its options go with the request)
        and after it; a request the guard refuses is not sent."""
        options = self.guard.before()
        self.writes += 1
        try:
            result = self.call(fn, *args, **options, **kwargs)
        except BackendError:
            self.guard.after()
            raise
        self.guard.after()
        return result
