package lakehouse.server;

import java.io.BufferedReader;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * The server's two credentials: the pipeline's token (writes) and the readers' (reads every
 * table, changes none of the pipeline's). The server process reads both from its standard input
 * when it starts, so neither is in its environment, on its command line or in a setting a client
 * can read; only their SHA-256 digests are kept.
 */
public final class Credentials {
  /** What a credential may do. */
  public enum Role {
    PIPELINE,
    READER
  }

  /** The user name a SQL endpoint client logs in with, with the readers' token as password. */
  public static final String READER_USER = "reader";

  private static volatile byte[] pipeline;
  private static volatile byte[] reader;

  private Credentials() {}

  /**
   * Read the two tokens, one a line (the pipeline's, then the readers'); fails if either is
   * missing or empty, or if they are the same.
   */
  static void load(BufferedReader in) throws IOException {
    String first = in.readLine();
    String second = in.readLine();
    if (first == null || first.isBlank() || second == null || second.isBlank()) {
      throw new IllegalStateException(
          "the server expects two tokens on its standard input, one a line: the pipeline's, then"
              + " the readers' (lakehouse spark start passes them)");
    }
    if (first.strip().equals(second.strip())) {
      throw new IllegalStateException("the pipeline's and the readers' tokens must differ");
    }
    pipeline = digest(first.strip());
    reader = digest(second.strip());
  }

  /** Whether the tokens were loaded (they are in the lakehouse's server, not elsewhere). */
  static boolean loaded() {
    return pipeline != null && reader != null;
  }

  /** The role of a presented token, or null when it is neither (or none were loaded). */
  public static Role roleOf(String token) {
    if (token == null || !loaded()) {
      return null;
    }
    byte[] presented = digest(token);
    // Both compared, in constant time: how long a refusal takes says nothing of the tokens.
    boolean isPipeline = MessageDigest.isEqual(presented, pipeline);
    boolean isReader = MessageDigest.isEqual(presented, reader);
    return isPipeline ? Role.PIPELINE : isReader ? Role.READER : null;
  }

  private static byte[] digest(String token) {
    try {
      return MessageDigest.getInstance("SHA-256").digest(token.getBytes(StandardCharsets.UTF_8));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("the JVM has no SHA-256", e);
    }
  }
}
