package lakehouse.server;

import java.io.BufferedReader;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * The one credential a server takes: the pipeline's token on the pipeline's server, the readers'
 * on the readers' server. The process reads it from its standard input when it starts, so it is
 * not in its environment, on its command line or in a setting a client can read; only its
 * SHA-256 digest is kept. The two servers are apart: neither token opens the other's.
 */
final class Credentials {
  /** The user name a SQL endpoint client logs in with, with the readers' token as password. */
  static final String READER_USER = "reader";

  private static volatile byte[] token;

  private Credentials() {}

  /** Read the token, one line; fails if it is missing or empty. */
  static void load(BufferedReader in) throws IOException {
    String line = in.readLine();
    if (line == null || line.isBlank()) {
      throw new IllegalStateException(
          "the server expects its token on its standard input (lakehouse spark start passes it)");
    }
    token = digest(line.strip());
  }

  /** Whether {@code presented} is this server's token (compared in constant time). */
  static boolean accepts(String presented) {
    byte[] expected = token;
    return presented != null && expected != null && MessageDigest.isEqual(digest(presented), expected);
  }

  private static byte[] digest(String value) {
    try {
      return MessageDigest.getInstance("SHA-256").digest(value.getBytes(StandardCharsets.UTF_8));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("the JVM has no SHA-256", e);
    }
  }
}
