package lakehouse.server;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connect.service.SparkConnectService$;
import org.apache.spark.sql.hive.thriftserver.HiveThriftServer2$;

/**
 * The lakehouse's two Spark servers, one main class, each its own JVM (its first argument says
 * which):
 *
 * <ul>
 *   <li>{@code pipeline}: the one committing driver. Spark Connect for the pipeline's clients (the
 *       pipeline's token), and the catalog the readers' server reads ({@link CatalogService}).
 *   <li>{@code readers}: every reader's query, apart from the pipeline: Spark Connect and the SQL
 *       endpoint (Spark's Thrift server, HiveServer2's protocol, for JDBC/ODBC tools), with the
 *       readers' token, its own heap, a file system that changes no file of the lake ({@link
 *       ReadersFileSystem}), the catalog of the pipeline's server, the readers' check ({@link
 *       ReaderGuard}, {@link TokenInterceptor}) and a statement timeout ({@link QueryBounds}).
 * </ul>
 *
 * <p>Either reads its token from its standard input ({@link Credentials}), starts the session with
 * the settings spark-submit gave it, then its services on that session's context, and runs until
 * the Connect service ends or the JVM is stopped.
 */
public final class LakehouseServer {
  private LakehouseServer() {}

  public static void main(String[] args) throws Exception {
    boolean readers = args.length > 0 && args[0].equals("readers");
    if (args.length != 1 || !(readers || args[0].equals("pipeline"))) {
      System.err.println("usage: LakehouseServer pipeline|readers (lakehouse spark start runs it)");
      System.exit(2);
    }
    Credentials.load(new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)));
    if (readers) {
      TokenInterceptor.forReaders();
      // HiveServer2 looks its CUSTOM login class up in a HiveConf of its own, made when a client
      // logs in, which reads the JVM's system properties, not the session's settings.
      System.setProperty(
          "hive.server2.custom.authentication.class", ReaderAuthentication.class.getName());
    }
    // The settings Spark's SparkConnectServer starts its session with: each Connect session's
    // artifacts stay its own.
    SparkSession session =
        SparkSession.builder()
            .config("spark.sql.artifact.isolation.enabled", true)
            .config("spark.sql.artifact.isolation.alwaysApplyClassloader", true)
            .getOrCreate();
    try {
      if (readers) {
        QueryBounds.install(session.sparkContext());
      } else {
        CatalogService.start((org.apache.spark.sql.classic.SparkSession) session);
      }
      SparkConnectService$.MODULE$.start(session.sparkContext());
      if (readers) {
        // Its listener failing later ends the JVM: no readers' server without its SQL endpoint.
        HiveThriftServer2$.MODULE$.startWithSparkSession(session, true);
      }
    } catch (Throwable e) {
      System.err.println("the lakehouse's Spark server (" + args[0] + ") could not start: " + e);
      e.printStackTrace();
      System.exit(1);
    }
    SparkConnectService$.MODULE$.server().awaitTermination();
  }
}
