package lakehouse.server;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.HashSet;
import java.util.Locale;
import java.util.Set;
import org.apache.hadoop.hive.conf.HiveConf;
import org.apache.hadoop.hive.metastore.HiveMetaStore;
import org.apache.hadoop.hive.metastore.TSetIpAddressProcessor;
import org.apache.hadoop.hive.metastore.api.ThriftHiveMetastore;
import org.apache.spark.SparkConf;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.hive.HiveExternalCatalog;
import org.apache.spark.sql.hive.client.HiveClientImpl;
import org.apache.thrift.protocol.TBinaryProtocol;
import org.apache.thrift.server.TServer;
import org.apache.thrift.server.TThreadPoolServer;
import org.apache.thrift.transport.TServerSocket;
import org.apache.thrift.transport.TTransportFactory;

/**
 * The catalog the readers' server reads its names from: Hive's metastore service (its Thrift
 * protocol, what {@code hive.metastore.uris} connects to), served by the pipeline's server on the
 * pipeline's own metastore database, on 127.0.0.1 only, every call passing {@link CatalogGuard}.
 * The pipeline keeps using its metastore directly, in this JVM; the readers' server holds no
 * login to the database, so the names have one source of truth, which only the pipeline changes
 * for its schemas.
 *
 * <p>The service is a metastore handler of Hive's own made from the pipeline's Hive client's
 * settings (the same database, the same DataNucleus settings, so the two share one connection
 * factory and one Derby engine), with the readers' file system ({@link ReadersFileSystem}) for
 * what the metastore does to files itself: making a new schema's folder in the warehouse,
 * deleting a dropped managed table's.
 */
final class CatalogService {
  static final String PORT_CONF = "spark.lakehouse.catalog.port";
  static final String SCHEMAS_CONF = "spark.lakehouse.pipelineSchemas";
  static final String FOLDERS_CONF = "spark.lakehouse.lakeFolders";
  static final String WAREHOUSE_CONF = "spark.sql.warehouse.dir";

  private CatalogService() {}

  /** Start the service on {@value #PORT_CONF} when it is set; returns at once (it serves on). */
  static void start(SparkSession session) throws Exception {
    SparkConf conf = session.sparkContext().conf();
    int port = conf.getInt(PORT_CONF, 0);
    if (port <= 0) {
      return;
    }
    HiveExternalCatalog catalog =
        (HiveExternalCatalog) session.sharedState().externalCatalog().unwrapped();
    HiveConf hive = new HiveConf(((HiveClientImpl) catalog.client()).conf());
    String lake = conf.get(FOLDERS_CONF, "");
    String warehouse = conf.get(WAREHOUSE_CONF);
    for (String scheme : new String[] {"file", "s3a", "s3"}) {
      String real = hive.get("fs." + scheme + ".impl");
      if (real != null) {
        hive.set(String.format(ReadersFileSystem.DELEGATE, scheme), real);
      }
      hive.set("fs." + scheme + ".impl.disable.cache", "true");
    }
    hive.set("fs.file.impl", ReadersLocalFileSystem.class.getName());
    hive.set("fs.s3a.impl", ReadersFileSystem.class.getName());
    hive.set("fs.s3.impl", ReadersFileSystem.class.getName());
    hive.set(ReadersFileSystem.READABLE, lake.isEmpty() ? warehouse : lake + "," + warehouse);
    hive.set(ReadersFileSystem.WRITABLE, warehouse);
    Set<String> schemas = new HashSet<>();
    for (String s : conf.get(SCHEMAS_CONF, "").split(",")) {
      if (!s.isBlank()) {
        schemas.add(s.strip().toLowerCase(Locale.ROOT));
      }
    }
    ThriftHiveMetastore.Iface handler =
        CatalogGuard.guard(
            HiveMetaStore.newRetryingHMSHandler("lakehouse-readers-catalog", hive, false),
            schemas,
            Places.of(warehouse),
            Places.list(lake));
    TServerSocket socket =
        new TServerSocket(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
    TServer server =
        new TThreadPoolServer(
            new TThreadPoolServer.Args(socket)
                .processor(new TSetIpAddressProcessor<>(handler))
                .protocolFactory(new TBinaryProtocol.Factory())
                .transportFactory(new TTransportFactory())
                .minWorkerThreads(2)
                .maxWorkerThreads(64));
    Thread serving = new Thread(server::serve, "lakehouse-readers-catalog");
    serving.setDaemon(true);
    serving.start();
  }
}
