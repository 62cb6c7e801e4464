"""The S3-compatible store of a lake on object storage, as each client reaches it.

One :class:`S3Store` (from ``MEDALLION_S3_*`` and the ``AWS_*`` key pair,
docs/settings.md) answers for three clients:

* deltalake (delta-rs's ``object_store``): :meth:`S3Store.delta_storage_options`;
* pyarrow's filesystems, which list the lake and its landing folders on the
  driver: :meth:`S3Store.filesystem`;
* Spark's Hadoop S3A connector (``hadoop-aws`` from Maven, at the Hadoop
  version of the pyspark wheel: :func:`hadoop_aws_package`):
  :meth:`S3Store.spark_config` and :meth:`S3Store.hadoop_secrets`. ``s3://``
  is mapped to S3A too, so a table's location is the same URI for every client.

The key pair never becomes a Spark setting (pyspark passes those to
``spark-submit`` on the JVM's command line): it is set on the Hadoop
configuration after the JVM starts, as the catalog's metastore password is.

Code that has no lake resource at hand (the IO manager's and the engines' deltalake
calls, given only a table's location) reaches the store through
:func:`storage_options_for`: the same settings, read from the process's environment,
where a deployment's processes have them and Dagster's ``EnvVar`` reads the key pair
from too. Nothing of them passes through Spark's plans or options.

Unset settings are left to each client's defaults (``AWS_*`` variables, profiles,
instance roles). Nothing here runs at import.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from functools import lru_cache

from dagster import Config
from pydantic import Field

from medallion_assets.settings import is_s3_uri, read_settings, variables_feeding

#: Hadoop's S3A connector; its version must be the Hadoop of Spark's own jars.
HADOOP_AWS_PACKAGE = "org.apache.hadoop:hadoop-aws:{version}"
#: The Hadoop settings holding the key pair (set after the JVM starts, never as Spark settings).
S3A_ACCESS_KEY = "fs.s3a.access.key"
S3A_SECRET_KEY = "fs.s3a.secret.key"


class S3Store(Config):
    """An S3-compatible store: endpoint, region, addressing and key pair (all optional)."""

    endpoint: str | None = Field(default=None, description="http(s)://host[:port]; unset: AWS S3's endpoint.")
    region: str | None = Field(default=None, description="The bucket's region; unset: the clients' default.")
    path_style: bool | None = Field(default=None, description="Bucket in the path, not the host name.")
    access_key_id: str | None = Field(default=None, description="Access key (EnvVar AWS_ACCESS_KEY_ID).")
    secret_access_key: str | None = Field(default=None, description="Secret key (EnvVar AWS_SECRET_ACCESS_KEY).")

    def _key_pair(self) -> tuple[str, str] | None:
        if self.access_key_id and self.secret_access_key:
            return str(self.access_key_id), str(self.secret_access_key)
        return None

    def delta_storage_options(self) -> dict[str, str]:
        """deltalake's options for this store (the secret included: give them to deltalake only)."""
        options: dict[str, str] = {}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint.rstrip("/")
            if self.endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        if self.region:
            options["AWS_REGION"] = self.region
        if self.path_style is not None:
            options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false" if self.path_style else "true"
        pair = self._key_pair()
        if pair:
            options["AWS_ACCESS_KEY_ID"], options["AWS_SECRET_ACCESS_KEY"] = pair
        return options

    def filesystem(self):
        """pyarrow's S3 filesystem on this store."""
        from pyarrow import fs  # deferred: pyarrow's S3 support loads only where a lake is on S3

        endpoint = (self.endpoint or "").rstrip("/")
        pair = self._key_pair()
        return fs.S3FileSystem(
            endpoint_override=endpoint.split("://", 1)[1] if endpoint else None,
            scheme=endpoint.split("://", 1)[0] if endpoint else "https",
            region=self.region,
            access_key=pair[0] if pair else None,
            secret_key=pair[1] if pair else None,
            force_virtual_addressing=self.path_style is False,
        )

    def spark_config(self) -> dict[str, str]:
        """Spark settings of the S3A connector for this store, without the key pair (:meth:`hadoop_secrets`).

        ``s3://`` and ``s3a://`` both go through S3A. The key pair, when set, is the only
        credential provider tried, so a wrong one fails rather than falling back to another.
        """
        config = {
            "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
        }
        if self.endpoint:
            config["spark.hadoop.fs.s3a.endpoint"] = self.endpoint.rstrip("/")
            config["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https://")).lower()
        if self.region:
            config["spark.hadoop.fs.s3a.endpoint.region"] = self.region
        if self.path_style is not None:
            config["spark.hadoop.fs.s3a.path.style.access"] = str(self.path_style).lower()
        if self._key_pair():
            config["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            )
        return config

    def hadoop_secrets(self) -> dict[str, str]:
        """The key pair as S3A's Hadoop settings, for the Hadoop configuration once the JVM runs."""
        pair = self._key_pair()
        return {S3A_ACCESS_KEY: pair[0], S3A_SECRET_KEY: pair[1]} if pair else {}


#: The variables of the lake's store: the lake root, ``MEDALLION_S3_*`` and the key pair.
_STORE_VARIABLES = ("MEDALLION_LAKE_ROOT", *variables_feeding("LakeResource"))


def store_of_environment(environ: Mapping[str, str] | None = None) -> S3Store:
    """The lake's store as the environment's settings give it (``MEDALLION_S3_*``, the ``AWS_*`` key pair).

    Raises:
        SettingsError: one of these settings is unusable (named, with its fix).
    """
    environ = os.environ if environ is None else environ
    return _store_of(tuple(sorted((k, v) for k, v in environ.items() if k in _STORE_VARIABLES)))


@lru_cache(maxsize=4)
def _store_of(variables: tuple[tuple[str, str], ...]) -> S3Store:
    given = dict(variables)
    fields = read_settings(given).fields_of("LakeResource")
    return S3Store(
        endpoint=fields.get("s3_endpoint"),
        region=fields.get("s3_region"),
        path_style=fields.get("s3_path_style"),
        access_key_id=given.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=given.get("AWS_SECRET_ACCESS_KEY"),
    )


def storage_options_for(location: str) -> dict[str, str] | None:
    """deltalake's storage options for a table at ``location``: for an ``s3://``/``s3a://`` one, the store
    of the environment's settings (:func:`store_of_environment`); ``None`` (deltalake's defaults) otherwise.

    The secret is included: give them to deltalake only.
    """
    return store_of_environment().delta_storage_options() if is_s3_uri(str(location)) else None


def hadoop_aws_package() -> str:
    """``hadoop-aws`` at the Hadoop version of the installed pyspark's jars (``hadoop-client-api-<v>.jar``).

    Raises:
        RuntimeError: pyspark's jars hold no Hadoop client (a Spark without Hadoop, whose own
            ``hadoop-aws`` must then be on its classpath).
    """
    import pyspark  # deferred: only a session on an S3 lake asks

    jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar"))
    versions = [m.group(1) for jar in jars if (m := re.search(r"hadoop-client-api-(.+)\.jar$", jar))]
    if not versions:
        raise RuntimeError(
            "pyspark's jars hold no hadoop-client-api jar to match hadoop-aws to: put the hadoop-aws jar of "
            "your Spark's Hadoop on its classpath (spark.jars), with MEDALLION_LAKE_ROOT on s3://"
        )
    return HADOOP_AWS_PACKAGE.format(version=sorted(versions)[-1])
