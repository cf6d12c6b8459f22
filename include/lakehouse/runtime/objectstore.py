"""Where the lakehouse's data lives: a local folder or an S3 bucket, behind one set of names.

``LAKEHOUSE_DATA`` (default: ``LAKEHOUSE_HOME``) is the root of the tables, the schema registry,
the quality ledger and the landing files. It is a local path or ``s3://bucket/prefix`` (or
``s3a://``); anything else is refused when the settings are read. A location in a bucket is an
:class:`ObjectPath`, which joins and names like :class:`pathlib.Path`; code that needs the files
themselves (listing a log, reading a segment) goes through the functions here, which use the
standard library for local paths and pyarrow's S3 filesystem for a bucket.

The store is reached with settings, never with credentials in them:

* ``LAKEHOUSE_S3_ENDPOINT``: an S3-compatible store's URL (``http://minio:9000``); unset for AWS;
* ``LAKEHOUSE_S3_PATH_STYLE``: ``true`` for ``endpoint/bucket/key`` addressing (what MinIO and
  moto expect; the default when an endpoint is set), ``false`` for virtual-hosted buckets;
* ``LAKEHOUSE_S3_REGION``: the bucket's region (default ``AWS_REGION``, else ``us-east-1``).

Credentials come from the standard AWS sources of each process (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, a profile, an instance role): S3A, delta-rs
and pyarrow each look there themselves, so no key is ever a Spark setting, a log line or a
contract field.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, cast
from urllib.parse import urlsplit

from lakehouse.errors import ConfigError

if TYPE_CHECKING:
    from pyarrow import fs as pafs

SCHEMES = ("s3", "s3a")
# The settings that say how to reach the store (never its credentials).
STORE_SETTINGS = ("LAKEHOUSE_S3_ENDPOINT", "LAKEHOUSE_S3_PATH_STYLE", "LAKEHOUSE_S3_REGION")
# S3's bucket naming rules (general purpose buckets): 3-63 characters of lower-case letters,
# digits, '.' and '-', starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class ObjectPath:
    """A location in a bucket, ``<scheme>://<bucket>/<key>``; joined with ``/`` like a Path.

    The key never starts or ends with ``/`` and has no empty, ``.`` or ``..`` segments, so
    two spellings of one location are one value."""

    scheme: str
    bucket: str
    key: str = ""

    @classmethod
    def parse(cls, uri: str, *, setting: str = "LAKEHOUSE_DATA") -> ObjectPath:
        parts = urlsplit(uri)
        if parts.scheme not in SCHEMES:
            raise ConfigError(
                f"{setting}={uri!r}: the lakehouse stores data in a local folder or in S3 "
                f"({' or '.join(s + '://bucket/prefix' for s in SCHEMES)}), not "
                f"{parts.scheme + '://' if parts.scheme else 'this'}"
            )
        if parts.query or parts.fragment or parts.username or parts.port:
            raise ConfigError(f"{setting}={uri!r}: give s3://bucket/prefix only, no ?, # or @")
        if not _BUCKET.fullmatch(parts.netloc):
            raise ConfigError(
                f"{setting}={uri!r}: {parts.netloc!r} is not an S3 bucket name (3-63 "
                "lower-case letters, digits, '.' or '-')"
            )
        segments = [s for s in parts.path.split("/") if s]
        if any(s in {".", ".."} for s in segments):
            raise ConfigError(f"{setting}={uri!r}: no '.' or '..' in the prefix")
        return cls(parts.scheme, parts.netloc, "/".join(segments))

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}" if self.key else self.root

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __truediv__(self, part: str | os.PathLike[str]) -> ObjectPath:
        segments = [s for s in str(part).split("/") if s]
        if any(s in {".", ".."} for s in segments):
            raise ConfigError(f"{self} / {str(part)!r}: no '.' or '..' in a key")
        return ObjectPath(self.scheme, self.bucket, "/".join([self.key, *segments]).strip("/"))

    @property
    def root(self) -> str:
        return f"{self.scheme}://{self.bucket}"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.scheme, self.bucket, self.key.rpartition("/")[0])

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    def resolve(self) -> ObjectPath:
        return self

    def is_relative_to(self, other: Location) -> bool:
        if not isinstance(other, ObjectPath) or other.bucket != self.bucket:
            return False
        return not other.key or self.key == other.key or self.key.startswith(other.key + "/")

    def relative_to(self, other: Location) -> PurePosixPath:
        if not self.is_relative_to(other):
            raise ValueError(f"{self} is not under {other}")
        assert isinstance(other, ObjectPath)
        return PurePosixPath(self.key[len(other.key) :].lstrip("/") or ".")

    def endswith(self, suffix: str) -> bool:
        return self.key.endswith(suffix)

    @property
    def store_path(self) -> str:
        """``bucket/key``, the name pyarrow's S3 filesystem gives the object."""
        return f"{self.bucket}/{self.key}".rstrip("/")


Location = Path | ObjectPath


def location(raw: str | os.PathLike[str], *, setting: str = "LAKEHOUSE_DATA") -> Location:
    """``raw`` as a location: an :class:`ObjectPath` for ``s3://``/``s3a://``, an absolute local
    path for a path; any other ``scheme://`` is refused (it would otherwise become a folder
    named after the scheme)."""
    text = os.fspath(raw)
    if "://" in text:
        return ObjectPath.parse(text, setting=setting)
    return Path(text).expanduser().resolve()


def as_location(path: Location | str) -> Location:
    """``path`` as a normalized location (a local path resolved), e.g. to key a mapping."""
    return location(path) if isinstance(path, str) else path.resolve()


# -- the store's settings --------------------------------------------------------------------
@dataclass(frozen=True)
class S3Settings:
    endpoint: str | None
    path_style: bool
    region: str

    @classmethod
    def from_env(cls) -> S3Settings:
        endpoint = os.environ.get("LAKEHOUSE_S3_ENDPOINT", "").strip() or None
        if endpoint is not None:
            parts = urlsplit(endpoint)
            if parts.scheme not in {"http", "https"} or not parts.hostname or parts.path.strip("/"):
                raise ConfigError(
                    f"LAKEHOUSE_S3_ENDPOINT={endpoint!r}: give the store's URL, "
                    "http(s)://host[:port], with no path"
                )
            if parts.username or parts.password:
                raise ConfigError(
                    "LAKEHOUSE_S3_ENDPOINT must not carry credentials: set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY instead"
                )
        raw_style = os.environ.get("LAKEHOUSE_S3_PATH_STYLE", "").strip().lower()
        if raw_style not in {"", "true", "false"}:
            raise ConfigError(f"LAKEHOUSE_S3_PATH_STYLE must be true or false, not {raw_style!r}")
        path_style = raw_style == "true" if raw_style else endpoint is not None
        region = (
            os.environ.get("LAKEHOUSE_S3_REGION")
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1"
        ).strip()
        if not re.fullmatch(r"[a-z0-9-]{2,40}", region):
            raise ConfigError(f"LAKEHOUSE_S3_REGION={region!r} is not a region name")
        return cls(endpoint, path_style, region)

    @property
    def secure(self) -> bool:
        return self.endpoint is None or self.endpoint.startswith("https://")

    def spark_conf(self) -> dict[str, str]:
        """Hadoop's S3A settings for these, as Spark settings. ``s3://`` is served by S3A too,
        and no credential is among them: S3A's default chain reads the environment."""
        conf = {
            "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            # Hadoop's FileContext API too (Delta's log writer asks for it first).
            "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
            "spark.hadoop.fs.AbstractFileSystem.s3a.impl": "org.apache.hadoop.fs.s3a.S3A",
            "spark.hadoop.fs.s3a.path.style.access": str(self.path_style).lower(),
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(self.secure).lower(),
        }
        if self.endpoint is not None:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
            # Stores other than AWS S3 reject or mis-check the SDK's newer default checksums
            # (apache/hadoop#8059).
            conf["spark.hadoop.fs.s3a.checksum.generation"] = "false"
        return conf

    def storage_options(self) -> dict[str, str]:
        """delta-rs's options for these (its credentials come from the environment)."""
        options = {
            "AWS_REGION": self.region,
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not self.path_style).lower(),
        }
        if self.endpoint is not None:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            options["AWS_ALLOW_HTTP"] = str(not self.secure).lower()
        return options


# What the store's settings and pyarrow's client are read from: a change to any of these (another
# deployment's environment in the same process) gives new ones, not the first ones cached.
_ENVIRONMENT = (
    "LAKEHOUSE_S3_ENDPOINT",
    "LAKEHOUSE_S3_PATH_STYLE",
    "LAKEHOUSE_S3_REGION",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
)


def _environment() -> tuple[str | None, ...]:
    return tuple(os.environ.get(name) for name in _ENVIRONMENT)


def _s3_settings() -> S3Settings:
    return _settings_for(_environment())


@cache
def _settings_for(environment: tuple[str | None, ...]) -> S3Settings:
    return S3Settings.from_env()


def storage_options(path: Location | str) -> dict[str, str] | None:
    """delta-rs's ``storage_options`` for a table at ``path`` (None for a local one)."""
    text = str(path)
    if text.split("://", 1)[0] in SCHEMES and "://" in text:
        return _s3_settings().storage_options()
    return None


def _filesystem() -> pafs.S3FileSystem:
    return _filesystem_for(_environment())


@cache
def _filesystem_for(environment: tuple[str | None, ...]) -> pafs.S3FileSystem:
    from pyarrow import fs as pafs

    s3 = _s3_settings()
    kwargs: dict[str, Any] = {"region": s3.region}
    if s3.endpoint is not None:
        parts = urlsplit(s3.endpoint)
        kwargs["endpoint_override"] = parts.netloc
        kwargs["scheme"] = parts.scheme
    kwargs["force_virtual_addressing"] = not s3.path_style
    return pafs.S3FileSystem(**kwargs)


# -- files at a location ---------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    path: Location
    is_dir: bool
    size: int
    mtime_ns: int

    @property
    def name(self) -> str:
        return self.path.name


def _entry(path: ObjectPath, info: Any) -> Entry | None:
    from pyarrow import fs as pafs

    if info.type == pafs.FileType.NotFound:
        return None
    mtime = info.mtime_ns or 0
    return Entry(path, info.type == pafs.FileType.Directory, info.size or 0, mtime)


def stat(path: Location) -> Entry | None:
    """The file or folder at ``path``, or None."""
    if isinstance(path, ObjectPath):
        return _entry(path, _filesystem().get_file_info(path.store_path))
    try:
        st = path.stat()
    except OSError:
        return None
    return Entry(path, path.is_dir(), st.st_size, st.st_mtime_ns)


def exists(path: Location) -> bool:
    return stat(path) is not None


def is_dir(path: Location) -> bool:
    if isinstance(path, ObjectPath):
        entry = stat(path)
        return entry is not None and entry.is_dir
    return path.is_dir()


def listdir(path: Location) -> list[Entry]:
    """What a folder holds, sorted by name; nothing if it is not there."""
    if isinstance(path, ObjectPath):
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(path.store_path, allow_not_found=True)
        found = [
            _entry(path / info.base_name, info) for info in _filesystem().get_file_info(selector)
        ]
        return sorted((e for e in found if e is not None), key=lambda e: e.name)
    try:
        children = sorted(path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    entries = (stat(child) for child in children)
    return [e for e in entries if e is not None]


def names(path: Location) -> list[str]:
    """The names in a folder, unsorted, without looking at each entry (nothing if it is not
    there): for a table's log, which every write looks at and which holds thousands of files."""
    if isinstance(path, ObjectPath):
        return [e.name for e in listdir(path)]
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_bytes(path: Location) -> bytes:
    if isinstance(path, ObjectPath):
        with _filesystem().open_input_stream(path.store_path) as stream:
            return bytes(stream.read())
    return path.read_bytes()


def open_input(path: Location) -> BinaryIO:
    """A file to read with ``seek`` and ``read`` (an object is fetched by ranged GETs as read)."""
    if isinstance(path, ObjectPath):
        return cast(BinaryIO, _filesystem().open_input_file(path.store_path))
    return path.open("rb")


def write_bytes(path: Location, data: bytes) -> None:
    """Write a whole file so that readers see all of it or none: one PUT on S3, a temporary
    file renamed into place locally."""
    if isinstance(path, ObjectPath):
        with _filesystem().open_output_stream(path.store_path) as stream:
            stream.write(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def remove_tree(path: Location) -> None:
    """Delete a folder and everything under it (nothing if it is not there)."""
    if isinstance(path, ObjectPath):
        if exists(path):
            _filesystem().delete_dir(path.store_path)
        return
    shutil.rmtree(path, ignore_errors=True)


def walk_files(path: Location) -> Iterator[Entry]:
    """Every file under ``path``, at any depth."""
    for entry in listdir(path):
        if entry.is_dir:
            yield from walk_files(entry.path)
        else:
            yield entry


def check_reachable(root: Location) -> None:
    """Fail with a message naming the store and the bucket unless the bucket answers (before
    any data moves, rather than a Java stack trace in the first write)."""
    if not isinstance(root, ObjectPath):
        return
    s3 = _s3_settings()
    where = s3.endpoint or f"AWS S3 ({s3.region})"
    try:
        entry = _filesystem().get_file_info(root.bucket)
    except OSError as exc:
        raise ConfigError(
            f"LAKEHOUSE_DATA={root}: the bucket {root.bucket!r} cannot be reached at {where}: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    from pyarrow import fs as pafs

    if entry.type == pafs.FileType.NotFound:
        raise ConfigError(
            f"LAKEHOUSE_DATA={root}: there is no bucket {root.bucket!r} at {where}; create it first"
        )


# Delta's log store for several drivers committing to one table on S3 (delta-storage-s3-dynamodb,
# a DynamoDB table as the arbiter of each commit); the default S3 log store assumes one driver.
MULTI_DRIVER_LOG_STORE = "io.delta.storage.S3DynamoDBLogStore"


def check_commit_safety(root: Location, conf: dict[str, str]) -> None:
    """Refuse a Spark application of its own (a ``spark-submit`` per task) committing to tables
    in a bucket unless ``conf`` gives it Delta's multi-driver log store: Delta's default S3 log
    store keeps two commits of one version apart only inside one JVM, and S3 lets the second
    overwrite the first. The platform's own way is one driver, the Spark server that every
    layer task is a client of."""
    if not isinstance(root, ObjectPath):
        return
    key = f"spark.delta.logStore.{root.scheme}.impl"
    if conf.get(key) == MULTI_DRIVER_LOG_STORE:
        return
    raise ConfigError(
        f"the data is in a bucket ({root}), where Delta keeps concurrent commits apart only "
        "inside one Spark driver: run the layer tasks on the Spark server (an Airflow "
        "connection of type spark_connect), or give every spark-submit Delta's DynamoDB log "
        f"store ({key}={MULTI_DRIVER_LOG_STORE}, with io.delta:delta-storage-s3-dynamodb on its "
        "class path)"
    )


def reset() -> None:
    """Forget the settings and the filesystem read from the environment (tests change it)."""
    _settings_for.cache_clear()
    _filesystem_for.cache_clear()
