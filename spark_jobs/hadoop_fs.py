"""Small file operations through Hadoop's FileSystem (via the Spark JVM), so a job's
checkpoint and output paths may be local folders or cluster stores (HDFS, S3, ...)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


class HadoopFs:
    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm = spark.sparkContext._jvm  # noqa: SLF001 - PySpark's only way to the JVM (Hadoop FileSystem through py4j)
        assert jvm is not None
        self._jvm = jvm
        self._root = jvm.org.apache.hadoop.fs.Path(root)
        self._fs = self._root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # noqa: SLF001

    def path(self, *parts: str) -> Any:
        p = self._root
        for part in parts:
            p = self._jvm.org.apache.hadoop.fs.Path(p, part)
        return p

    def exists(self, *parts: str) -> bool:
        return bool(self._fs.exists(self.path(*parts)))

    def names(self, *parts: str) -> list[str]:
        if not self.exists(*parts):
            return []
        return [str(s.getPath().getName()) for s in self._fs.listStatus(self.path(*parts))]

    def read_text(self, *parts: str) -> str:
        stream = self._fs.open(self.path(*parts))
        try:
            scanner = self._jvm.java.util.Scanner(stream, "UTF-8").useDelimiter("\\A")
            return str(scanner.next()) if scanner.hasNext() else ""
        finally:
            stream.close()

    def write_text(self, text: str, *parts: str) -> None:
        stream = self._fs.create(self.path(*parts), True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()
