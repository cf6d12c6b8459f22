package lakehouse.server;

import javax.security.sasl.AuthenticationException;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * The SQL endpoint's login (HiveServer2's CUSTOM authentication), on the readers' server: the
 * user {@code reader} with the readers' token as password, and no one else.
 */
public final class ReaderAuthentication implements PasswdAuthenticationProvider {
  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    if (!Credentials.READER_USER.equals(user) || !Credentials.accepts(password)) {
      throw new AuthenticationException(
          "wrong user or password: log in as user '"
              + Credentials.READER_USER
              + "' with the readers' token (`lakehouse spark reader` prints it)");
    }
  }
}
