"""The object store: datasets, rollouts, checkpoints and reports, on `file://` or `s3://`.

Everything a run writes goes through here, keyed by `/`-separated relative paths, so that a
restarted run finds what an earlier attempt finished and a reader on another machine never sees
half of something:

- single objects are atomic: on `file://` they are written to a hidden temp name in the same
  directory and `os.replace`d into place; on S3 one PUT (or a completed multipart upload) is
  atomic per object. Temp names are invisible to `exists`, `ls` and `get_*`.
- directories (checkpoints: many files) are written file by file and then sealed with a
  `_COMPLETE` marker object holding their content hash; only sealed directories are trusted.

Transient storage errors (connection refused/reset, timeouts, 5xx) are retried with backoff for
up to `retry_s` seconds and then raised as `StoreUnavailable`, never swallowed. A missing key is
not an outage: it raises `FileNotFoundError` at once.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from swerl.config import StorageConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

COMPLETE = "_COMPLETE"  # the marker object that seals a directory written by put_dir
TMP_PREFIX = ".swerl-tmp-"  # in-flight file:// writes; never a valid key segment
CHUNK = 1 << 20


class StoreUnavailable(RuntimeError):
    """The storage backend stayed unreachable for the whole retry window."""


# ---------------------------------------------------------------------------------------------
# content hashes


def content_hash(data: bytes | Iterable[bytes]) -> str:
    """sha256 hex of bytes or of a stream of chunks (so large files need not fit in memory)."""
    h = hashlib.sha256()
    for chunk in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
        h.update(chunk)
    return h.hexdigest()


def short_hash(digest: str, n: int = 12) -> str:
    """The prefix used in keys and names (`datasets/{name}/{short}`): long enough to be unique."""
    return digest[:n]


def _read_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def _dir_files(local_dir: Path) -> list[str]:
    """Relative posix paths of every regular file under `local_dir`, sorted."""
    return sorted(p.relative_to(local_dir).as_posix() for p in local_dir.rglob("*") if p.is_file())


def hash_dir(local_dir: str | Path) -> str:
    """One digest over file names and contents, independent of mtimes and walk order."""
    root = Path(local_dir)
    h = hashlib.sha256()
    for rel in _dir_files(root):
        h.update(rel.encode() + b"\0")
        h.update(bytes.fromhex(content_hash(_read_chunks(root / rel))))
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# errors: which ones are worth waiting out


@functools.cache
def _network_error_types() -> tuple[type[BaseException], ...]:
    """Exception types of the S3 client stack that mean 'the network or server hiccupped'."""
    import asyncio

    types: list[type[BaseException]] = [ConnectionError, TimeoutError, asyncio.TimeoutError]
    try:
        from botocore import exceptions as bx

        types += [bx.ConnectionError, bx.HTTPClientError]
    except ImportError:
        pass
    try:
        import aiohttp

        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError]
    except ImportError:
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    except ImportError:
        pass
    return tuple(types)


_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
              NotADirectoryError, KeyError, ValueError)
_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ECONNREFUSED,
                     errno.ECONNRESET, errno.EPIPE, errno.ESTALE}


def _http_status(err: BaseException) -> int | None:
    response = getattr(err, "response", None)
    if isinstance(response, dict):
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


def is_transient(err: BaseException) -> bool:
    """Could the same call succeed if we wait? Follows `__cause__`: s3fs wraps boto errors."""
    if isinstance(err, _PERMANENT):
        return False
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, _network_error_types()):
            return True
        status = _http_status(seen)
        if status is not None and (status >= 500 or status == 429):
            return True
        if isinstance(seen, OSError) and seen.errno in _TRANSIENT_ERRNOS:
            return True
        seen = seen.__cause__
    return False


def retry_call(fn: Callable[[], T], what: str, retry_s: float, *,
               transient: Callable[[BaseException], bool] = is_transient,
               unavailable: type[Exception] = StoreUnavailable) -> T:
    """Call `fn`, waiting out transient errors with exponential backoff for up to `retry_s`.

    `transient` and `unavailable` let other infrastructure clients (tracking) share the loop.
    """
    deadline = time.monotonic() + retry_s
    delay, attempts = 0.5, 0
    while True:
        attempts += 1
        try:
            return fn()
        except Exception as e:
            if not transient(e):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise unavailable(
                    f"{what}: unreachable for {retry_s:.0f}s ({attempts} attempts); "
                    f"last error: {type(e).__name__}: {e}"
                ) from e
            log.warning("%s: transient error (%s: %s), retrying in %.1fs",
                        what, type(e).__name__, e, min(delay, left))
            time.sleep(min(delay, left))
            delay = min(delay * 2, 10.0)


# ---------------------------------------------------------------------------------------------
# keys and local atomic writes


def _clean_key(key: str, allow_root: bool = False) -> str:
    """Keys are relative, `/`-separated, without `.`/`..` or temp names; a trailing `/` is dropped."""
    if not isinstance(key, str):
        raise TypeError(f"store key must be str, got {type(key).__name__}")
    stripped = key.rstrip("/")
    if not stripped:
        if allow_root:
            return ""
        raise ValueError("empty store key")
    if stripped.startswith("/") or "\\" in stripped:
        raise ValueError(f"store key must be a relative '/'-separated path: {key!r}")
    for part in stripped.split("/"):
        if part in ("", ".", "..") or part.startswith(TMP_PREFIX):
            raise ValueError(f"invalid segment {part!r} in store key {key!r}")
    return stripped


def _is_hidden(key: str) -> bool:
    return any(part.startswith(TMP_PREFIX) for part in key.split("/"))


def write_local_atomic(path: Path, chunks: Iterable[bytes]) -> None:
    """Write beside the target, fsync, then rename: readers see the old object or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _local_root(rest: str) -> Path:
    """`file://.swerl/store` is relative to the working directory; `file:///abs` is absolute."""
    return Path(rest).expanduser().resolve()


# ---------------------------------------------------------------------------------------------
# the store


class Store:
    """A key -> bytes store rooted at `uri` (`file://...` or `s3://bucket/prefix`)."""

    def __init__(self, uri: str, endpoint_url: str | None = None, key: str | None = None,
                 secret: str | None = None, retry_s: float = 120.0) -> None:
        self.retry_s = retry_s
        self._bucket_ready = False
        if uri.startswith("s3://"):
            import s3fs  # imported here: file:// users should not pay for the S3 client stack

            bucket, _, prefix = uri[len("s3://"):].strip("/").partition("/")
            if not bucket:
                raise ValueError(f"s3 store URI needs a bucket: {uri!r}")
            self.local = False
            self.bucket = bucket
            self._root = f"{bucket}/{prefix}" if prefix else bucket
            self.uri = f"s3://{self._root}"
            self.endpoint_url = endpoint_url or os.environ.get("SWERL_S3_ENDPOINT_URL")
            # One attempt per call inside s3fs/botocore: the retry window is ours (retry_call),
            # so that `retry_s` means what it says instead of multiplying hidden retry loops.
            self.fs = s3fs.S3FileSystem(
                key=key or os.environ.get("AWS_ACCESS_KEY_ID"),
                secret=secret or os.environ.get("AWS_SECRET_ACCESS_KEY"),
                endpoint_url=self.endpoint_url,
                skip_instance_cache=True,
                use_listings_cache=False,
                config_kwargs={"connect_timeout": 5, "read_timeout": 60,
                               "retries": {"max_attempts": 1}},
            )
            self.fs.retries = 1  # a class attribute in s3fs, not a constructor argument
        elif uri.startswith("file://") or "://" not in uri:
            from fsspec.implementations.local import LocalFileSystem

            root = _local_root(uri[len("file://"):] if uri.startswith("file://") else uri)
            self.local = True
            self.bucket = None
            self._root = root.as_posix()
            self.uri = f"file://{self._root}"
            self.endpoint_url = None
            self.fs = LocalFileSystem()
        else:
            raise ValueError(f"unsupported store URI {uri!r} (use file://... or s3://bucket/...)")

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    # -- plumbing -----------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        key = _clean_key(key, allow_root=True)
        return f"{self._root}/{key}" if key else self._root

    def _key_of(self, path: str) -> str:
        path = path.rstrip("/")
        return "" if path == self._root else path[len(self._root) + 1:]

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        return retry_call(fn, f"{what} ({self.uri})", self.retry_s)

    def _ensure_bucket(self) -> None:
        if self.local or self._bucket_ready:
            return

        def make() -> None:
            try:
                self.fs.mkdir(self.bucket)
            except FileExistsError:
                pass

        self._retry(f"create bucket {self.bucket}", make)
        self._bucket_ready = True

    def _find(self, key: str) -> list[str]:
        """Every object path under `key` (or `key` itself), temp files included."""
        try:
            found = self.fs.find(self._path(key), detail=True)
        except FileNotFoundError:  # e.g. the bucket does not exist yet
            return []
        # Only objects: S3 gateways may report an emptied "directory" placeholder for a prefix.
        return [path for path, info in found.items() if info.get("type") == "file"]

    # -- single objects -----------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(_clean_key(key))
        self._ensure_bucket()
        if self.local:
            self._retry(f"put {key}", lambda: write_local_atomic(Path(path), [data]))
        else:
            self._retry(f"put {key}", lambda: self.fs.pipe_file(path, data))

    def put_file(self, local_path: str | Path, key: str) -> None:
        """Upload one local file (streamed: checkpoint shards do not fit comfortably in memory)."""
        path = self._path(_clean_key(key))
        src = Path(local_path)
        self._ensure_bucket()
        if self.local:
            self._retry(f"put {key}", lambda: write_local_atomic(Path(path), _read_chunks(src)))
        else:
            self._retry(f"put {key}", lambda: self.fs.put_file(str(src), path))

    def get_bytes(self, key: str) -> bytes:
        path = self._path(_clean_key(key))
        try:
            return self._retry(f"get {key}", lambda: self.fs.cat_file(path))
        except (FileNotFoundError, IsADirectoryError):
            raise FileNotFoundError(f"no object {key!r} in {self.uri}") from None

    def get_file(self, key: str, local_path: str | Path) -> Path:
        """Download one object; the local file appears complete or not at all."""
        path = self._path(_clean_key(key))
        dest = Path(local_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            self._retry(f"get {key}", lambda: self.fs.get_file(path, str(tmp)))
            os.replace(tmp, dest)
        except (FileNotFoundError, IsADirectoryError):
            raise FileNotFoundError(f"no object {key!r} in {self.uri}") from None
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    def put_text(self, key: str, text: str) -> None:
        self.put_bytes(key, text.encode("utf-8"))

    def get_text(self, key: str) -> str:
        return self.get_bytes(key).decode("utf-8")

    def put_json(self, key: str, obj: Any) -> None:
        self.put_bytes(key, json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8"))

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    def exists(self, key: str) -> bool:
        """Is there a finished object at `key`? (A directory prefix is not an object.)"""
        path = self._path(_clean_key(key))

        def probe() -> bool:
            # Not fs.isfile/exists for objects: fsspec's isfile turns *every* error into False,
            # which would make an outage look like "not written yet".
            try:
                return self.fs.info(path)["type"] == "file"
            except FileNotFoundError:
                return False

        return self._retry(f"exists {key}", probe)

    def ls(self, prefix: str = "") -> list[str]:
        """Keys under `prefix` (a directory-like prefix, or one key), recursive and sorted."""
        prefix = _clean_key(prefix, allow_root=True)
        paths = self._retry(f"ls {prefix or '/'}", lambda: self._find(prefix))
        return sorted(k for k in map(self._key_of, paths) if k and not _is_hidden(k))

    def delete(self, prefix: str) -> int:
        """Remove `prefix` (one key or everything under it); returns how many objects went.

        Directory markers go first, so no reader trusts a directory while its files vanish.
        Deleting something absent is not an error: restarts call this on half-written state.
        Unfinished S3 uploads under `prefix` go too, as a dead writer's temp files do on file://.
        """
        prefix = _clean_key(prefix)  # an empty prefix (the whole store) is refused on purpose
        keys = self.ls(prefix)
        markers = [self._path(k) for k in keys if k.rsplit("/", 1)[-1] == COMPLETE]

        def remove() -> None:
            if markers:
                self.fs.rm([m for m in markers if self.fs.exists(m)])
            if self._find(prefix):
                self.fs.rm(self._path(prefix), recursive=True)

        self._retry(f"delete {prefix}", remove)
        self._abort_uploads(prefix)
        return len(keys)

    def uploads_in_progress(self, prefix: str = "") -> list[str]:
        """Keys under `prefix` with an unfinished S3 multipart upload ([] on file://).

        Invisible to readers, but their parts are stored (and billed) until aborted.
        """
        return sorted({self._key_of(path) for path, _ in self._retry(
            f"list uploads {prefix or '/'}", lambda: self._open_uploads(prefix))})

    def _open_uploads(self, prefix: str) -> list[tuple[str, str]]:
        """(object path, upload id) of the multipart uploads open under `prefix`, every page."""
        if self.local:
            return []
        root = self._path(prefix)
        bucket, _, key_prefix = root.partition("/")
        found: list[tuple[str, str]] = []
        page_args: dict[str, str] = {}
        while True:
            try:
                page = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key_prefix,
                                       **page_args)
            except FileNotFoundError:  # no bucket yet: nothing was ever uploaded
                return []
            for upload in page.get("Uploads", []):
                key = upload["Key"]
                if not key_prefix or key == key_prefix or key.startswith(key_prefix + "/"):
                    found.append((f"{bucket}/{key}", upload["UploadId"]))
            if not page.get("IsTruncated"):
                return found
            page_args = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}

    def _abort_uploads(self, prefix: str) -> None:
        """Abort the uploads a writer cut off mid-file left open (it could not: the server was
        gone). Only for prefixes nobody is writing to, which put_dir and delete assume anyway."""

        def abort() -> None:
            for path, upload_id in self._open_uploads(prefix):
                bucket, _, key = path.partition("/")
                try:
                    self.fs.abort_mpu(bucket, key, upload_id)
                except FileNotFoundError:  # aborted by an earlier try whose reply was lost
                    pass

        self._retry(f"abort uploads under {prefix}", abort)

    def local_path(self, key: str) -> Path | None:
        """Where `key` lives on this machine's disk, for file:// stores; None for S3."""
        return Path(self._path(_clean_key(key))) if self.local else None

    def url(self, key: str = "") -> str:
        """A URI for `key` that other tools understand (MLflow sources, manifests, logs)."""
        key = _clean_key(key, allow_root=True)
        return f"{self.uri}/{key}" if key else self.uri

    # -- directories (checkpoints) ------------------------------------------------------------

    def dir_complete(self, key: str) -> bool:
        return self.exists(f"{_clean_key(key)}/{COMPLETE}")

    def dir_manifest(self, key: str) -> dict[str, Any]:
        """The marker of a sealed directory: {"hash", "files", "bytes"}; FileNotFoundError if unsealed."""
        try:
            return self.get_json(f"{_clean_key(key)}/{COMPLETE}")
        except FileNotFoundError:
            raise FileNotFoundError(f"no complete directory {key!r} in {self.uri}") from None

    def put_dir(self, local_dir: str | Path, key: str) -> str:
        """Upload every file under `local_dir` to `key/`, then seal it; returns its hash_dir.

        An identical sealed directory is left alone (a restarted run does not re-upload a
        checkpoint); anything else at `key` is replaced, unsealing it first.
        """
        key = _clean_key(key)
        src = Path(local_dir)
        if not src.is_dir():
            raise NotADirectoryError(f"put_dir: {src} is not a directory")
        files = _dir_files(src)
        if COMPLETE in files:
            raise ValueError(f"put_dir: {src} contains a file named {COMPLETE}, reserved for the marker")
        digest = hash_dir(src)
        if self.dir_complete(key) and self.dir_manifest(key).get("hash") == digest:
            return digest
        self.delete(key)
        total = 0
        for rel in files:
            self.put_file(src / rel, f"{key}/{rel}")
            total += (src / rel).stat().st_size
        self.put_json(f"{key}/{COMPLETE}", {"hash": digest, "files": files, "bytes": total})
        self._abort_uploads(key)  # left open by put_file attempts that a storage outage cut off
        return digest

    def get_dir(self, key: str, local_dir: str | Path) -> Path:
        """Download a sealed directory and check its hash; the result appears all at once.

        `local_dir` must not exist yet (or be empty): mixing a checkpoint into leftovers would
        make the hash check meaningless.
        """
        key = _clean_key(key)
        manifest = self.dir_manifest(key)
        dest = Path(local_dir)
        if dest.exists() and any(dest.iterdir()):
            raise FileExistsError(f"get_dir: {dest} exists and is not empty")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            for rel in manifest["files"]:
                self.get_file(f"{key}/{rel}", tmp / rel)
            tmp.mkdir(exist_ok=True)  # an empty directory is a valid (if odd) checkpoint
            got = hash_dir(tmp)
            if got != manifest["hash"]:
                raise OSError(f"get_dir {self.url(key)}: hash mismatch "
                              f"(manifest {short_hash(manifest['hash'])}, got {short_hash(got)})")
            if dest.exists():
                dest.rmdir()
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest


def open_store(cfg: StorageConfig, retry_s: float | None = None) -> Store:
    """The run's store from config; credentials fall back to the environment (AWS_*)."""
    return Store(cfg.uri, endpoint_url=cfg.s3_endpoint_url, key=cfg.s3_key,
                 secret=cfg.s3_secret, retry_s=cfg.retry_s if retry_s is None else retry_s)
