package lakehouse.server;

import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import java.util.TreeSet;
import org.apache.hadoop.hive.metastore.api.AddPartitionsRequest;
import org.apache.hadoop.hive.metastore.api.ColumnStatistics;
import org.apache.hadoop.hive.metastore.api.Database;
import org.apache.hadoop.hive.metastore.api.DropPartitionsRequest;
import org.apache.hadoop.hive.metastore.api.MetaException;
import org.apache.hadoop.hive.metastore.api.Partition;
import org.apache.hadoop.hive.metastore.api.SetPartitionsStatsRequest;
import org.apache.hadoop.hive.metastore.api.StorageDescriptor;
import org.apache.hadoop.hive.metastore.api.Table;
import org.apache.hadoop.hive.metastore.api.ThriftHiveMetastore;

/**
 * What the readers' server may ask of the catalog ({@link CatalogService}), by an allow-list of
 * the metastore's calls: every call that reads (its name starts with {@code get_}, but for those
 * that hand out tokens, keys and settings), and the calls that create, change and drop schemas,
 * tables, partitions and statistics when everything they name is the reader's own: in a schema
 * that is not one of the pipeline's, stored under the readers' warehouse. Every other call (a
 * new one of a later Hive too) is refused with {@code READ_ONLY_CREDENTIAL}. So a reader can
 * neither point a name at other files ({@code SET LOCATION}), nor move, rename, alter or drop a
 * pipeline table's entry, nor make the metastore delete a folder of the lake (it deletes a
 * managed table's folder when it drops the table, and the reader's tables are all in the
 * warehouse).
 */
final class CatalogGuard implements InvocationHandler {
  // Calls whose name starts with get_ but which hand out secrets or the metastore's settings.
  private static final Set<String> SECRET =
      Set.of(
          "get_delegation_token",
          "get_token",
          "get_all_token_identifiers",
          "get_master_keys",
          "get_config_value");
  // Calls that read, without the get_ prefix.
  private static final Set<String> READS =
      Set.of(
          "set_ugi",
          "partition_name_to_spec",
          "partition_name_to_vals",
          "partition_name_has_valid_characters",
          "list_privileges",
          "list_roles",
          "show_locks",
          "show_compact",
          "isPartitionMarkedForEvent");

  private final ThriftHiveMetastore.Iface metastore;
  private final Set<String> schemas;
  private final Places.Place warehouse;
  private final List<Places.Place> lake;

  private CatalogGuard(
      ThriftHiveMetastore.Iface metastore,
      Set<String> schemas,
      Places.Place warehouse,
      List<Places.Place> lake) {
    this.metastore = metastore;
    this.schemas = schemas;
    this.warehouse = warehouse;
    this.lake = lake;
  }

  /**
   * {@code metastore} behind the readers' allow-list: the pipeline's {@code schemas} (lower
   * case), the readers' {@code warehouse} and the {@code lake}'s folders.
   */
  static ThriftHiveMetastore.Iface guard(
      ThriftHiveMetastore.Iface metastore,
      Set<String> schemas,
      Places.Place warehouse,
      List<Places.Place> lake) {
    return (ThriftHiveMetastore.Iface)
        Proxy.newProxyInstance(
            CatalogGuard.class.getClassLoader(),
            new Class<?>[] {ThriftHiveMetastore.Iface.class},
            new CatalogGuard(metastore, schemas, warehouse, lake));
  }

  @Override
  public Object invoke(Object proxy, Method method, Object[] args) throws Throwable {
    if (method.getDeclaringClass() == Object.class) {
      return method.invoke(this, args);
    }
    check(method.getName(), args == null ? new Object[0] : args);
    try {
      return method.invoke(metastore, args);
    } catch (InvocationTargetException e) {
      throw e.getCause();
    }
  }

  private void check(String call, Object[] args) throws MetaException {
    if (call.startsWith("get_") ? !SECRET.contains(call) : READS.contains(call)) {
      return;
    }
    switch (call) {
      case "create_database" -> database(call, (Database) args[0]);
      case "alter_database" -> {
        own(call, (String) args[0]);
        database(call, (Database) args[1]);
      }
      case "drop_database",
          "drop_table",
          "drop_table_with_environment_context",
          "append_partition",
          "append_partition_with_environment_context",
          "append_partition_by_name",
          "append_partition_by_name_with_environment_context",
          "drop_partition",
          "drop_partition_with_environment_context",
          "drop_partition_by_name",
          "drop_partition_by_name_with_environment_context",
          "delete_table_column_statistics",
          "delete_partition_column_statistics" -> own(call, (String) args[0]);
      case "create_table", "create_table_with_environment_context", "create_table_with_constraints" ->
          table(call, (Table) args[0]);
      case "alter_table", "alter_table_with_environment_context", "alter_table_with_cascade" -> {
        own(call, (String) args[0]);
        table(call, (Table) args[2]);
      }
      case "add_partition", "add_partition_with_environment_context" ->
          partition(call, (Partition) args[0]);
      case "add_partitions" -> partitions(call, args[0]);
      case "add_partitions_req" -> {
        AddPartitionsRequest request = (AddPartitionsRequest) args[0];
        own(call, request.getDbName());
        partitions(call, request.getParts());
      }
      case "drop_partitions_req" -> own(call, ((DropPartitionsRequest) args[0]).getDbName());
      case "alter_partition", "alter_partition_with_environment_context" -> {
        own(call, (String) args[0]);
        partition(call, (Partition) args[2]);
      }
      case "alter_partitions", "alter_partitions_with_environment_context" -> {
        own(call, (String) args[0]);
        partitions(call, args[2]);
      }
      case "rename_partition" -> {
        own(call, (String) args[0]);
        partition(call, (Partition) args[3]);
      }
      case "update_table_column_statistics", "update_partition_column_statistics" ->
          own(call, ((ColumnStatistics) args[0]).getStatsDesc().getDbName());
      case "set_aggr_stats_for" -> {
        for (ColumnStatistics stats : ((SetPartitionsStatsRequest) args[0]).getColStats()) {
          own(call, stats.getStatsDesc().getDbName());
        }
      }
      default -> throw refused(call + " (not among the calls a reader may make)");
    }
  }

  private void database(String call, Database database) throws MetaException {
    own(call, database.getName());
    at(call, "schema " + database.getName(), database.getLocationUri());
  }

  private void table(String call, Table table) throws MetaException {
    own(call, table.getDbName());
    stored(call, table.getDbName() + "." + table.getTableName(), table.getSd());
  }

  private void partitions(String call, Object list) throws MetaException {
    for (Object one : (List<?>) list) {
      partition(call, (Partition) one);
    }
  }

  private void partition(String call, Partition partition) throws MetaException {
    own(call, partition.getDbName());
    stored(
        call,
        "a partition of " + partition.getDbName() + "." + partition.getTableName(),
        partition.getSd());
  }

  /**
   * Refuses storage outside the readers' warehouse: its location, and the {@code path} Spark keeps
   * in the storage's properties for a data source table (whose Hive location is a placeholder).
   */
  private void stored(String call, String what, StorageDescriptor storage) throws MetaException {
    if (storage == null) {
      return;
    }
    at(call, what, storage.getLocation());
    if (storage.getSerdeInfo() != null && storage.getSerdeInfo().getParameters() != null) {
      for (var property : storage.getSerdeInfo().getParameters().entrySet()) {
        if (property.getKey().equalsIgnoreCase("path")) {
          at(call, what, property.getValue());
        }
      }
    }
  }

  /** Refuses a call on a pipeline schema (or one that names none). */
  private void own(String call, String schema) throws MetaException {
    if (schema == null || schemas.contains(schema.toLowerCase(Locale.ROOT))) {
      throw refused(call + " on schema " + schema);
    }
  }

  /** Refuses a location outside the readers' warehouse (none given: the metastore's own). */
  private void at(String call, String what, String location) throws MetaException {
    if (location == null || location.isBlank()) {
      return;
    }
    Places.Place place = Places.of(location);
    if (place == null || place.underAny(lake) || !place.under(warehouse)) {
      throw refused(call + " of " + what + " at " + location);
    }
  }

  private MetaException refused(String what) {
    return new MetaException(
        Refusal.message(
            what,
            "it reads every table, and creates, changes and drops tables and views only in"
                + " schemas of its own (not "
                + String.join(", ", new TreeSet<>(schemas))
                + "), stored under the readers' warehouse ("
                + warehouse
                + ")"));
  }
}
