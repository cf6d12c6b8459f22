package lakehouse.server;

import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerJobEnd;
import org.apache.spark.scheduler.SparkListenerJobStart;

/**
 * The readers' statement timeout, for both protocols: the jobs of one statement (a Spark Connect
 * operation, by its operation tag; a SQL endpoint statement, by its job group) are cancelled once
 * its first job started longer ago than {@value #TIMEOUT_CONF} seconds. The statement fails with
 * Spark's cancellation error, which names the limit; the server and every other statement go on.
 */
final class QueryBounds extends SparkListener {
  static final String TIMEOUT_CONF = "spark.lakehouse.readers.queryTimeout";
  private static final String OPERATION_TAG = "SparkConnect_OperationTag_";
  private static final long FORGET_MS = 10 * 60 * 1000L;

  private static final class Statement {
    final long started = System.currentTimeMillis();
    final boolean tagged;
    int running;
    long idleSince;

    Statement(boolean tagged) {
      this.tagged = tagged;
    }
  }

  private final SparkContext context;
  private final long timeoutMs;
  private final Map<String, Statement> statements = new ConcurrentHashMap<>();
  private final Map<Integer, String> jobs = new ConcurrentHashMap<>();

  private QueryBounds(SparkContext context, long timeoutSeconds) {
    this.context = context;
    this.timeoutMs = timeoutSeconds * 1000L;
  }

  /** Bound the statements of {@code context} by its {@value #TIMEOUT_CONF} (none when 0). */
  static void install(SparkContext context) {
    long seconds = context.conf().getLong(TIMEOUT_CONF, 0L);
    if (seconds <= 0) {
      return;
    }
    QueryBounds bounds = new QueryBounds(context, seconds);
    context.addSparkListener(bounds);
    ScheduledExecutorService timer =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "lakehouse-readers-query-timeout");
              t.setDaemon(true);
              return t;
            });
    timer.scheduleWithFixedDelay(bounds::enforce, 1, 1, TimeUnit.SECONDS);
  }

  @Override
  public void onJobStart(SparkListenerJobStart start) {
    Properties properties = start.properties();
    if (properties == null) {
      return;
    }
    String key = null;
    boolean tagged = false;
    for (String tag : properties.getProperty("spark.job.tags", "").split(",")) {
      if (tag.startsWith(OPERATION_TAG)) {
        key = tag;
        tagged = true;
      }
    }
    if (key == null) {
      key = properties.getProperty("spark.jobGroup.id");
    }
    if (key == null) {
      return;
    }
    boolean byTag = tagged;
    synchronized (this) {
      statements.computeIfAbsent(key, k -> new Statement(byTag)).running++;
      jobs.put(start.jobId(), key);
    }
  }

  @Override
  public void onJobEnd(SparkListenerJobEnd end) {
    String key = jobs.remove(end.jobId());
    if (key == null) {
      return;
    }
    synchronized (this) {
      Statement statement = statements.get(key);
      if (statement != null && --statement.running == 0) {
        statement.idleSince = System.currentTimeMillis();
      }
    }
  }

  private void enforce() {
    long now = System.currentTimeMillis();
    String reason =
        "the statement ran longer than the readers' limit of "
            + timeoutMs / 1000
            + " s (LAKEHOUSE_READERS_QUERY_TIMEOUT)";
    synchronized (this) {
      statements
          .entrySet()
          .removeIf(e -> e.getValue().running == 0 && now - e.getValue().idleSince > FORGET_MS);
      for (Map.Entry<String, Statement> entry : statements.entrySet()) {
        Statement statement = entry.getValue();
        // Cancelled again each second while any of its jobs runs: a job it starts after the
        // first cancellation goes too.
        if (statement.running > 0 && now - statement.started > timeoutMs) {
          if (statement.tagged) {
            context.cancelJobsWithTag(entry.getKey(), reason);
          } else {
            context.cancelJobGroup(entry.getKey(), reason);
          }
        }
      }
    }
  }
}
