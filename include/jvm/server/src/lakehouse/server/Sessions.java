package lakehouse.server;

import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connect.service.ExecuteJobTag$;
import org.apache.spark.sql.connect.service.SessionHolder;
import org.apache.spark.sql.connect.service.SessionHolderInfo;
import org.apache.spark.sql.connect.service.SparkConnectService$;
import org.apache.spark.sql.connect.service.SparkConnectSessionManager;
import scala.Option;
import scala.collection.Iterator;

/**
 * Which credential each session works for. A Spark Connect session is the pipeline's when the
 * pipeline's token opened it ({@link TokenInterceptor} records the role of each Connect session
 * id on its first request, and refuses the id to the other credential). Every other session is a
 * reader's: the SQL endpoint's (it logs in readers only) and any the server did not open for the
 * pipeline, so a session nobody recorded can never write.
 *
 * <p>What is judged is the request a plan is part of, not the session the plan was made in:
 * Delta makes some plans of its own (a table's log read) in the session that first loaded the
 * table, kept with its cached snapshot, which may be another session than the one asking, even
 * one that has ended. Spark Connect tags every job of an operation, on the thread that runs it,
 * with the operation's user and session ({@code ExecuteJobTag}); a plan analyzed on such a
 * thread is the pipeline's when every Connect session the thread's tags name is the pipeline's.
 * A call Spark Connect handles on the thread that received it (analyzing a plan, reading a
 * setting) is judged by the credential that call presented ({@link #during}). A plan on any other
 * thread (the SQL endpoint's) is judged by its own session.
 */
final class Sessions {
  private static final Map<String, Claim> CONNECT = new ConcurrentHashMap<>();
  private static final int PRUNE_ABOVE = 10_000;
  // A session id claimed this recently is kept even if Spark has no session for it yet: its
  // first request is still on its way to Spark's session manager.
  private static final long YOUNG_MS = 10 * 60 * 1000L;

  private record Claim(Credentials.Role role, long at) {}
  // The answer for a Connect session found in Spark's session manager (it cannot change: its id
  // keeps its role); weak keys, so a closed session's entry goes with it.
  private static final Map<SparkSession, Boolean> KNOWN = new WeakHashMap<>();

  // The credential of the Connect call this thread is handling, while it handles it.
  private static final ThreadLocal<Credentials.Role> CALL = new ThreadLocal<>();

  private Sessions() {}

  /** Run {@code handling} (a step of a Connect call) as a call of {@code role}. */
  static void during(Credentials.Role role, Runnable handling) {
    Credentials.Role before = CALL.get();
    CALL.set(role);
    try {
      handling.run();
    } finally {
      if (before == null) {
        CALL.remove();
      } else {
        CALL.set(before);
      }
    }
  }

  /**
   * Record that {@code role} uses the Connect session {@code sessionId}; returns the role the
   * session already had (the same, or another: the caller refuses that request).
   */
  static Credentials.Role claim(String sessionId, Credentials.Role role) {
    Claim before = CONNECT.putIfAbsent(sessionId, new Claim(role, System.currentTimeMillis()));
    if (before == null && CONNECT.size() > PRUNE_ABOVE) {
      prune();
    }
    return before == null ? role : before.role();
  }

  /**
   * Forget the ids of Connect sessions that are no longer active, so the record does not grow
   * with every session the server ever had. An active session keeps its role; a closed one is
   * never used again (Spark refuses a closed session's id, and a session it makes anew under an
   * id it has forgotten is a new session, whose role is recorded anew).
   */
  private static synchronized void prune() {
    Set<String> active = new HashSet<>();
    Iterator<SessionHolderInfo> infos =
        SparkConnectService$.MODULE$.sessionManager().listActiveSessions().iterator();
    while (infos.hasNext()) {
      active.add(infos.next().sessionId());
    }
    long young = System.currentTimeMillis() - YOUNG_MS;
    CONNECT.entrySet().removeIf(e -> !active.contains(e.getKey()) && e.getValue().at() < young);
  }

  /**
   * Whether a plan of {@code session}, analyzed on this thread, is the pipeline's: the Connect
   * call the thread handles presented the pipeline's token, or the operation the thread runs is
   * of a Connect session that token opened, or, on another thread, {@code session} is such a
   * session.
   */
  static boolean isPipeline(SparkSession session) {
    Credentials.Role call = CALL.get();
    if (call != null) {
      return call == Credentials.Role.PIPELINE;
    }
    Boolean asking = operationIsPipeline(session);
    return asking != null ? asking : sessionIsPipeline(session);
  }

  /**
   * Whether every Connect session whose operation tag this thread's jobs carry is the pipeline's,
   * or null when they carry none. Every session whose tag prefix matches counts: a user id made
   * to look like another session's prefix still matches its own session's, a reader's.
   */
  private static Boolean operationIsPipeline(SparkSession session) {
    scala.collection.immutable.Set<String> tags = session.sparkContext().getJobTags();
    if (tags.isEmpty()) {
      return null;
    }
    boolean any = false;
    Iterator<SessionHolderInfo> infos =
        SparkConnectService$.MODULE$.sessionManager().listActiveSessions().iterator();
    while (infos.hasNext()) {
      SessionHolderInfo info = infos.next();
      String prefix = ExecuteJobTag$.MODULE$.apply(info.userId(), info.sessionId(), "");
      if (tags.exists(tag -> tag.startsWith(prefix))) {
        Claim claim = CONNECT.get(info.sessionId());
        if (claim == null || claim.role() != Credentials.Role.PIPELINE) {
          return false;
        }
        any = true;
      }
    }
    return any ? Boolean.TRUE : null;
  }

  /** Whether {@code session} is a Connect session the pipeline's token opened. */
  private static boolean sessionIsPipeline(SparkSession session) {
    synchronized (KNOWN) {
      Boolean known = KNOWN.get(session);
      if (known != null) {
        return known;
      }
    }
    String id = connectSessionId(session);
    if (id == null) {
      return false;
    }
    Claim claim = CONNECT.get(id);
    if (claim == null) {
      return false; // not claimed yet: a reader's until its credential's first request says
    }
    boolean pipeline = claim.role() == Credentials.Role.PIPELINE;
    synchronized (KNOWN) {
      KNOWN.put(session, pipeline);
    }
    return pipeline;
  }

  /** The Connect session id whose Spark session is {@code session}, or null if none is. */
  private static String connectSessionId(SparkSession session) {
    SparkConnectSessionManager manager = SparkConnectService$.MODULE$.sessionManager();
    Iterator<SessionHolderInfo> infos = manager.listActiveSessions().iterator();
    while (infos.hasNext()) {
      Option<SessionHolder> holder = manager.getIsolatedSessionIfPresent(infos.next().key());
      if (holder.isDefined() && holder.get().session() == session) {
        return holder.get().sessionId();
      }
    }
    return null;
  }
}
