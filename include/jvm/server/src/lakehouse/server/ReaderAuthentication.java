package lakehouse.server;

import javax.security.sasl.AuthenticationException;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * The SQL endpoint's login (HiveServer2's CUSTOM authentication): the user {@code reader} with
 * the readers' token as password. The endpoint is for people and tools, so it takes no other
 * credential: every session it opens is a reader's ({@link ReaderGuard}).
 */
public final class ReaderAuthentication implements PasswdAuthenticationProvider {
  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    if (!Credentials.READER_USER.equals(user)
        || Credentials.roleOf(password) != Credentials.Role.READER) {
      throw new AuthenticationException(
          "wrong user or password: log in as user '"
              + Credentials.READER_USER
              + "' with the readers' token (`lakehouse spark reader` prints it)");
    }
  }
}
