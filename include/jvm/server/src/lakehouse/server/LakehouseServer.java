package lakehouse.server;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connect.service.SparkConnectService$;
import org.apache.spark.sql.hive.thriftserver.HiveThriftServer2$;

/**
 * The lakehouse's Spark server: one driver JVM serving Spark Connect (the pipeline and Spark
 * clients) and the SQL endpoint (Spark's Thrift server, HiveServer2's protocol, for JDBC/ODBC
 * tools), so every commit still comes from this one driver.
 *
 * <p>It reads the pipeline's and the readers' tokens from its standard input ({@link
 * Credentials}), starts the session with the settings spark-submit gave it, then Spark Connect
 * (as Spark's own SparkConnectServer does) and the Thrift server on that session's context, and
 * runs until the Connect service ends or the JVM is stopped.
 */
public final class LakehouseServer {
  private LakehouseServer() {}

  public static void main(String[] args) throws Exception {
    Credentials.load(new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)));
    // HiveServer2 looks its CUSTOM login class up in a HiveConf of its own, made when a client
    // logs in, which reads the JVM's system properties, not the session's settings.
    System.setProperty(
        "hive.server2.custom.authentication.class", ReaderAuthentication.class.getName());
    // The settings Spark's SparkConnectServer starts its session with: each Connect session's
    // artifacts stay its own.
    SparkSession session =
        SparkSession.builder()
            .config("spark.sql.artifact.isolation.enabled", true)
            .config("spark.sql.artifact.isolation.alwaysApplyClassloader", true)
            .getOrCreate();
    try {
      SparkConnectService$.MODULE$.start(session.sparkContext());
      // Its listener failing later ends the JVM: no server without its SQL endpoint.
      HiveThriftServer2$.MODULE$.startWithSparkSession(session, true);
    } catch (Throwable e) {
      System.err.println("the lakehouse's Spark server could not start: " + e);
      e.printStackTrace();
      System.exit(1);
    }
    SparkConnectService$.MODULE$.server().awaitTermination();
  }
}
