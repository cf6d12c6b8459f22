package lakehouse.server;

import java.util.Set;
import org.apache.spark.connect.proto.Command;
import org.apache.spark.connect.proto.ConfigRequest;
import org.apache.spark.connect.proto.ExecutePlanRequest;
import org.apache.spark.connect.proto.KeyValue;
import org.apache.spark.connect.proto.Plan;
import org.sparkproject.connect.grpc.ForwardingServerCallListener;
import org.sparkproject.connect.grpc.Metadata;
import org.sparkproject.connect.grpc.ServerCall;
import org.sparkproject.connect.grpc.ServerCallHandler;
import org.sparkproject.connect.grpc.ServerInterceptor;
import org.sparkproject.connect.grpc.Status;
import org.sparkproject.connect.protobuf.Descriptors;
import org.sparkproject.connect.protobuf.Message;

/**
 * Spark Connect's authentication (named in {@code spark.connect.grpc.interceptor.classes}, in place
 * of Spark's single pre-shared token): every call must carry {@code authorization: Bearer <token>}
 * with this server's token ({@link Credentials}).
 *
 * <p>On the readers' server it also admits by kind what does not go through Spark's analyzer,
 * where {@link ReaderGuard} checks the rest: of the commands of an execution, SQL, writes (which
 * the analyzer then checks), MERGE, temporary views and the listing of resources; of the
 * configuration calls, reads and the settings {@link SessionSettings} allows. Uploading
 * artifacts (jars, classes, Python files), code of the caller's anywhere in a plan (Scala, Java
 * and Python functions, which the server would deserialize or load), registering functions and
 * data sources, streaming, checkpoints, machine learning, pipelines, external commands, plugin
 * extensions, compressed commands and every command kind it does not list are refused.
 */
public final class TokenInterceptor implements ServerInterceptor {
  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
  private static final String BEARER = "Bearer ";
  private static final Set<Command.CommandTypeCase> COMMANDS =
      Set.of(
          Command.CommandTypeCase.SQL_COMMAND,
          Command.CommandTypeCase.WRITE_OPERATION,
          Command.CommandTypeCase.WRITE_OPERATION_V2,
          Command.CommandTypeCase.MERGE_INTO_TABLE_COMMAND,
          Command.CommandTypeCase.CREATE_DATAFRAME_VIEW,
          Command.CommandTypeCase.GET_RESOURCES_COMMAND,
          Command.CommandTypeCase.REMOVE_CACHED_REMOTE_RELATION_COMMAND);

  // Messages that carry code of the caller's: serialized Scala closures (deserialized by the
  // server as Java objects), Python functions, Java UDF classes, typed aggregators, Python data
  // sources. Refused wherever they appear in a request, before anything reads them.
  private static final Set<String> CODE =
      Set.of(
          "spark.connect.ScalarScalaUDF",
          "spark.connect.PythonUDF",
          "spark.connect.PythonUDTF",
          "spark.connect.JavaUDF",
          "spark.connect.TypedAggregateExpression",
          "spark.connect.PythonDataSource");

  private static volatile boolean readers;

  /** Make this the readers' server's interceptor (its main class calls it once, at start). */
  static void forReaders() {
    readers = true;
  }

  @Override
  public <Q, R> ServerCall.Listener<Q> interceptCall(
      ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
    String value = headers.get(AUTHORIZATION);
    if (value == null
        || !value.startsWith(BEARER)
        || !Credentials.accepts(value.substring(BEARER.length()))) {
      call.close(
          Status.UNAUTHENTICATED.withDescription(
              "no valid token: connect with this server's token"
                  + (readers ? " (the readers' token: `lakehouse spark reader`)" : "")),
          new Metadata());
      return new ServerCall.Listener<Q>() {};
    }
    if (!readers) {
      return next.startCall(call, headers);
    }
    if (call.getMethodDescriptor().getFullMethodName().endsWith("/AddArtifacts")) {
      call.close(
          Status.PERMISSION_DENIED.withDescription(Refusal.message("uploading artifacts", null)),
          new Metadata());
      return new ServerCall.Listener<Q>() {};
    }
    return new Checked<>(next.startCall(call, headers), call);
  }

  /** Each request of a reader's call, checked before the service sees it. */
  private static final class Checked<Q, R>
      extends ForwardingServerCallListener.SimpleForwardingServerCallListener<Q> {
    private final ServerCall<Q, R> call;
    private boolean refused;

    Checked(ServerCall.Listener<Q> delegate, ServerCall<Q, R> call) {
      super(delegate);
      this.call = call;
    }

    @Override
    public void onMessage(Q message) {
      if (refused) {
        return;
      }
      String why = check(message);
      if (why != null) {
        refused = true;
        call.close(Status.PERMISSION_DENIED.withDescription(why), new Metadata());
        return;
      }
      super.onMessage(message);
    }

    @Override
    public void onHalfClose() {
      if (!refused) {
        super.onHalfClose();
      }
    }

    @Override
    public void onReady() {
      if (!refused) {
        super.onReady();
      }
    }
  }

  /** Why a reader's {@code message} is refused, or null when it may go on. */
  static String check(Object message) {
    if (message instanceof ConfigRequest config) {
      return setting(config.getOperation());
    }
    if (!(message instanceof ExecutePlanRequest request)) {
      return null;
    }
    Plan plan = request.getPlan();
    String code = code(plan);
    if (code != null) {
      return Refusal.message("running code of the reader's (" + code + ")", null);
    }
    if (plan.hasCompressedOperation()
        && plan.getCompressedOperation().getOpType()
            != Plan.CompressedOperation.OpType.OP_TYPE_RELATION) {
      return Refusal.message("a compressed command", null);
    }
    if (!plan.hasCommand()) {
      return null;
    }
    Command.CommandTypeCase kind = plan.getCommand().getCommandTypeCase();
    return COMMANDS.contains(kind)
        ? null
        : Refusal.message("the Spark Connect command " + kind.name().toLowerCase(), null);
  }

  /** The type of the first message in {@code message} that carries code, or null. */
  private static String code(Message message) {
    String type = message.getDescriptorForType().getFullName();
    if (CODE.contains(type)) {
      return type;
    }
    for (var field : message.getAllFields().entrySet()) {
      if (field.getKey().getJavaType() != Descriptors.FieldDescriptor.JavaType.MESSAGE) {
        continue;
      }
      Object value = field.getValue();
      for (Object one : value instanceof java.util.List<?> many ? many : java.util.List.of(value)) {
        String found = code((Message) one);
        if (found != null) {
          return found;
        }
      }
    }
    return null;
  }

  private static String setting(ConfigRequest.Operation operation) {
    switch (operation.getOpTypeCase()) {
      case SET:
        for (KeyValue pair : operation.getSet().getPairsList()) {
          if (!SessionSettings.allowed(pair.getKey())) {
            return Refusal.message("setting " + pair.getKey(), null);
          }
        }
        return null;
      case UNSET:
        for (String key : operation.getUnset().getKeysList()) {
          if (!SessionSettings.allowed(key)) {
            return Refusal.message("unsetting " + key, null);
          }
        }
        return null;
      default:
        return null;
    }
  }
}
