package lakehouse.server;

import java.lang.reflect.Method;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.connect.proto.Command;
import org.apache.spark.connect.proto.ExecutePlanRequest;
import org.apache.spark.connect.proto.Plan;
import org.sparkproject.connect.grpc.ForwardingServerCallListener;
import org.sparkproject.connect.grpc.Metadata;
import org.sparkproject.connect.grpc.ServerCall;
import org.sparkproject.connect.grpc.ServerCallHandler;
import org.sparkproject.connect.grpc.ServerInterceptor;
import org.sparkproject.connect.grpc.Status;

/**
 * Spark Connect's authentication with two credentials (named in {@code
 * spark.connect.grpc.interceptor.classes}, in place of Spark's single pre-shared token): every call
 * must carry {@code authorization: Bearer <token>} with the pipeline's or the readers' token. The
 * role of each Connect session id is recorded on its first request ({@link Sessions}); a request
 * with the other credential for that id is refused. A reader's calls that do not go through
 * Spark's analyzer, where {@link ReaderGuard} checks them, are refused here: uploading artifacts
 * (jars, classes, Python files), registering functions and data sources, streaming writes,
 * machine-learning and pipeline commands, external commands, plugin extensions and compressed
 * commands (which cannot be read here).
 */
public final class TokenInterceptor implements ServerInterceptor {
  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
  private static final String BEARER = "Bearer ";
  private static final Map<String, Method> GETTERS = new ConcurrentHashMap<>();

  @Override
  public <Q, R> ServerCall.Listener<Q> interceptCall(
      ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
    String value = headers.get(AUTHORIZATION);
    Credentials.Role role =
        value != null && value.startsWith(BEARER)
            ? Credentials.roleOf(value.substring(BEARER.length()))
            : null;
    if (role == null) {
      call.close(
          Status.UNAUTHENTICATED.withDescription(
              "no valid token: connect with the pipeline's token or the readers' token"),
          new Metadata());
      return new ServerCall.Listener<Q>() {};
    }
    if (role == Credentials.Role.READER
        && call.getMethodDescriptor().getFullMethodName().endsWith("/AddArtifacts")) {
      call.close(
          Status.PERMISSION_DENIED.withDescription(refusal("uploading artifacts")), new Metadata());
      return new ServerCall.Listener<Q>() {};
    }
    return new Checked<>(next.startCall(call, headers), call, role);
  }

  static String refusal(String what) {
    return "READ_ONLY_CREDENTIAL: "
        + what
        + " is refused: this credential is read-only (the readers' token)";
  }

  /** Each request of a call, checked before the service sees it. */
  private static final class Checked<Q, R>
      extends ForwardingServerCallListener.SimpleForwardingServerCallListener<Q> {
    private final ServerCall<Q, R> call;
    private final Credentials.Role role;
    private boolean refused;

    Checked(ServerCall.Listener<Q> delegate, ServerCall<Q, R> call, Credentials.Role role) {
      super(delegate);
      this.call = call;
      this.role = role;
    }

    @Override
    public void onMessage(Q message) {
      if (refused) {
        return;
      }
      String why = check(message, role);
      if (why != null) {
        refused = true;
        call.close(Status.PERMISSION_DENIED.withDescription(why), new Metadata());
        return;
      }
      Sessions.during(role, () -> super.onMessage(message));
    }

    @Override
    public void onHalfClose() {
      if (!refused) {
        // A unary call (analyzing a plan, a setting) is handled here, on this thread.
        Sessions.during(role, super::onHalfClose);
      }
    }

    @Override
    public void onReady() {
      if (!refused) {
        super.onReady();
      }
    }
  }

  /** Why {@code message} is refused to {@code role}, or null when it may go on. */
  static String check(Object message, Credentials.Role role) {
    // A clone (CloneSession's new session id) is its source's credential's too.
    for (String getter : new String[] {"getSessionId", "getNewSessionId"}) {
      String sessionId = string(message, getter);
      if (sessionId != null && !sessionId.isEmpty()) {
        Credentials.Role owner = Sessions.claim(sessionId, role);
        if (owner != role) {
          return "the Spark Connect session "
              + sessionId
              + " was opened with another credential: open a new session";
        }
      }
    }
    if (role != Credentials.Role.READER || !(message instanceof ExecutePlanRequest request)) {
      return null;
    }
    Plan plan = request.getPlan();
    if (plan.hasCompressedOperation()
        && plan.getCompressedOperation().getOpType()
            != Plan.CompressedOperation.OpType.OP_TYPE_RELATION) {
      return refusal("a compressed command");
    }
    if (!plan.hasCommand()) {
      return null;
    }
    Command command = plan.getCommand();
    if (command.hasRegisterFunction() || command.hasRegisterTableFunction()) {
      return refusal("registering a function");
    }
    if (command.hasRegisterDataSource()) {
      return refusal("registering a data source");
    }
    if (command.hasWriteStreamOperationStart()) {
      return refusal("a streaming write");
    }
    if (command.hasMlCommand()) {
      return refusal("a machine-learning command");
    }
    if (command.hasPipelineCommand()) {
      return refusal("a pipeline command");
    }
    if (command.hasExecuteExternalCommand()) {
      return refusal("an external command");
    }
    if (command.hasExtension()) {
      return refusal("a plugin command");
    }
    if (command.hasCreateResourceProfileCommand()) {
      return refusal("creating a resource profile");
    }
    return null;
  }

  /**
   * A string field of a Connect request by its getter (every request has {@code getSessionId}),
   * or null for a message without it.
   */
  private static String string(Object message, String name) {
    Method getter =
        GETTERS.computeIfAbsent(
            message.getClass().getName() + "#" + name,
            key -> {
              try {
                Method found = message.getClass().getMethod(name);
                return found.getReturnType() == String.class ? found : null;
              } catch (NoSuchMethodException e) {
                return null;
              }
            });
    if (getter == null) {
      return null;
    }
    try {
      return (String) getter.invoke(message);
    } catch (ReflectiveOperationException e) {
      return null;
    }
  }
}
