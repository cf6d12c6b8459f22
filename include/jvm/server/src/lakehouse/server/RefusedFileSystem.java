package lakehouse.server;

import java.io.IOException;
import java.net.URI;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.security.AccessControlException;

/**
 * The readers' server's file system for every scheme but the lake's ({@code file:}, {@code s3a:}):
 * HTTP, HDFS, archives, views, other clouds. It cannot even be opened, so a reader's statement
 * cannot reach another server or store through a file path.
 */
public final class RefusedFileSystem extends ReadersFileSystem {
  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    throw new AccessControlException(
        Refusal.message(
            "reading " + name.getScheme() + ": paths",
            "it reads the lake's files (file: and s3a:) only"));
  }
}
