package lakehouse.server;

/** The words every refusal of the readers' credential starts with, whichever layer refuses. */
final class Refusal {
  static final String CODE = "READ_ONLY_CREDENTIAL";

  private Refusal() {}

  /** {@code READ_ONLY_CREDENTIAL: <what> is refused: this credential is read-only ...}. */
  static String message(String what, String may) {
    return CODE
        + ": "
        + what
        + " is refused: this credential is read-only (the readers' token)"
        + (may == null || may.isEmpty() ? "" : ": " + may);
  }
}
