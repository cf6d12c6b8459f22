package lakehouse.server;

import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.SparkSession;
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
 * <p>The one exception is the server's own session ({@link #own}), the one it started with: no
 * client is ever given it (each Connect session is an isolated one of its own, and the SQL
 * endpoint opens a new session per login, its single-session mode off), and Spark and Delta do
 * their internal work in it on threads that have no session of their own (a Delta log read from
 * a pool thread while a pipeline batch commits).
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

  private static volatile SparkSession own;

  private Sessions() {}

  /** Record the server's own session (see the class comment). */
  static void own(SparkSession session) {
    own = session;
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

  /** Whether {@code session} is a Connect session the pipeline's token opened. */
  static boolean isPipeline(SparkSession session) {
    if (session == own) {
      return true;
    }
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
