package lakehouse.server;

import java.io.File;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;

/**
 * The readers' server's {@code file:} file system ({@code fs.file.impl}): Hadoop's local file
 * system (with its checksum files, and a {@link LocalFileSystem}, which Hive and Spark ask for by
 * that class) over {@link ReadersFileSystem} over the raw local file system, so every call that
 * reaches a file passes the readers' rules.
 */
public final class ReadersLocalFileSystem extends LocalFileSystem {
  private final RawLocalFileSystem raw;

  public ReadersLocalFileSystem() {
    this(new RawLocalFileSystem());
  }

  private ReadersLocalFileSystem(RawLocalFileSystem raw) {
    super(new ReadersFileSystem(raw));
    this.raw = raw;
  }

  /** The local file of {@code path} (Hadoop's own casts the layer below to its raw class). */
  @Override
  public File pathToFile(Path path) {
    return raw.pathToFile(path);
  }
}
