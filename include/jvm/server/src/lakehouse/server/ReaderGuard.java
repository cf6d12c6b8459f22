package lakehouse.server;

import java.lang.reflect.Method;
import java.net.URI;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.hadoop.fs.Path;
import org.apache.spark.QueryContext;
import org.apache.spark.SparkConf;
import org.apache.spark.sql.AnalysisException;
import org.apache.spark.sql.catalyst.TableIdentifier;
import org.apache.spark.sql.catalyst.analysis.ResolvedIdentifier;
import org.apache.spark.sql.catalyst.analysis.ResolvedNamespace;
import org.apache.spark.sql.catalyst.analysis.ResolvedPersistentView;
import org.apache.spark.sql.catalyst.analysis.ResolvedTable;
import org.apache.spark.sql.catalyst.analysis.ResolvedTempView;
import org.apache.spark.sql.catalyst.catalog.CatalogStorageFormat;
import org.apache.spark.sql.catalyst.catalog.CatalogTable;
import org.apache.spark.sql.catalyst.catalog.HiveTableRelation;
import org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.TableSpecBase;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.execution.datasources.FileIndex;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.apache.spark.sql.execution.datasources.v2.FileTable;
import scala.Option;
import scala.Product;
import scala.Tuple2;
import scala.collection.Iterable;
import scala.collection.Iterator;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * The readers' SQL-level check: every plan of every session of the readers' server, after Spark
 * has analyzed it ({@link ReadOnlyExtension}), so it sees each statement and DataFrame operation
 * of both protocols (Spark Connect, the SQL endpoint) before anything runs. It admits by kind
 * (an allow-list) and refuses everything else with {@code READ_ONLY_CREDENTIAL}, so a command it
 * has never heard of is refused:
 *
 * <ul>
 *   <li>Queries made of Spark's own operators over the catalog's tables and the files of the
 *       lake and the warehouse; no other data source (JDBC runs statements of its own), no file
 *       elsewhere (the lakehouse's home, the machine's), no code of the reader's (scripts, Python,
 *       R, Java reflection; Scala and Java functions are refused before they reach the server).
 *   <li>Commands that only read: SHOW, DESCRIBE, EXPLAIN, USE, REFRESH, session variables, and
 *       SET of the settings {@link SessionSettings} allows.
 *   <li>Commands that create, change, fill or drop tables, views and schemas, when everything they
 *       change is the reader's own: named outside the pipeline's schemas ({@value #SCHEMAS_CONF})
 *       and, where it has a location, stored under the readers' warehouse ({@value
 *       #WAREHOUSE_CONF}). A command whose target cannot be told is refused.
 *   <li>Nothing else: caching, functions, jars and files, LOAD DATA, CONVERT TO DELTA, CLONE,
 *       RESTORE, OPTIMIZE, VACUUM, REORG, and every command not listed here.
 * </ul>
 *
 * A session that holds a setting a reader may not choose (given at a SQL endpoint login, say)
 * has every plan refused. This check is the first of three layers: the readers' file system
 * ({@link ReadersFileSystem}) and the catalog's ({@link CatalogGuard}) refuse the same writes
 * below it, whatever statement reaches them.
 */
final class ReaderGuard extends AbstractFunction1<LogicalPlan, BoxedUnit> {
  static final String FOLDERS_CONF = CatalogService.FOLDERS_CONF;
  static final String SCHEMAS_CONF = CatalogService.SCHEMAS_CONF;
  static final String WAREHOUSE_CONF = CatalogService.WAREHOUSE_CONF;
  private static final String DELTA = "org.apache.spark.sql.delta.";

  // Commands that change nothing of any table.
  private static final Set<String> READ_COMMANDS =
      Set.of(
          "ExplainCommand",
          "SetCommand",
          "ResetCommand",
          "SetCatalogAndNamespace",
          "SetNamespaceCommand",
          "SetCatalogCommand",
          "CreateVariable",
          "DropVariable",
          "SetVariable",
          "RefreshTable",
          "RefreshTableCommand",
          "UncacheTable",
          "UncacheTableCommand",
          "ClearCacheCommand",
          "ListFilesCommand",
          "ListJarsCommand",
          "ListArchivesCommand",
          "DropTempViewCommand",
          "NoopCommand");
  // Commands that change what they name: admitted when all of it is the reader's own.
  private static final Set<String> OWN_COMMANDS =
      Set.of(
          // Spark's catalog commands (both generations) and writes.
          "CreateTable",
          "CreateTableAsSelect",
          "ReplaceTable",
          "ReplaceTableAsSelect",
          "CreateTableLike",
          "CreateView",
          "CreateTempView",
          "AlterViewAs",
          "AlterViewSchemaBinding",
          "SetViewProperties",
          "UnsetViewProperties",
          "DropTable",
          "DropView",
          "CreateNamespace",
          "DropNamespace",
          "SetNamespaceLocation",
          "SetNamespaceProperties",
          "CommentOnNamespace",
          "CommentOnTable",
          "RenameTable",
          "AddColumns",
          "DropColumns",
          "RenameColumn",
          "AlterColumns",
          "ReplaceColumns",
          "SetTableProperties",
          "UnsetTableProperties",
          "SetTableLocation",
          "SetTableSerDeProperties",
          "AddCheckConstraint",
          "AddConstraint",
          "DropConstraint",
          "AddPartitions",
          "DropPartitions",
          "RenamePartitions",
          "RecoverPartitions",
          "RepairTable",
          "TruncateTable",
          "TruncatePartition",
          "AppendData",
          "OverwriteByExpression",
          "OverwritePartitionsDynamic",
          "DeleteFromTable",
          "DeleteFromTableWithFilters",
          "UpdateTable",
          "MergeIntoTable",
          "ReplaceData",
          "WriteDelta",
          "AnalyzeTable",
          "AnalyzeTables",
          "AnalyzeColumn",
          "InsertIntoDir",
          "CreateTableCommand",
          "CreateDataSourceTableCommand",
          "CreateDataSourceTableAsSelectCommand",
          "CreateTableLikeCommand",
          "CreateViewCommand",
          "AlterViewAsCommand",
          "AlterViewSchemaBindingCommand",
          "DropTableCommand",
          "TruncateTableCommand",
          "AlterTableRenameCommand",
          "AlterTableAddColumnsCommand",
          "AlterTableChangeColumnCommand",
          "AlterTableSetPropertiesCommand",
          "AlterTableUnsetPropertiesCommand",
          "AlterTableSerDePropertiesCommand",
          "AlterTableSetLocationCommand",
          "AlterTableAddPartitionCommand",
          "AlterTableDropPartitionCommand",
          "AlterTableRenamePartitionCommand",
          "RepairTableCommand",
          "CreateDatabaseCommand",
          "DropDatabaseCommand",
          "AlterDatabasePropertiesCommand",
          "AlterDatabaseSetLocationCommand",
          "UnsetNamespacePropertiesCommand",
          "AnalyzeTableCommand",
          "AnalyzeColumnCommand",
          "AnalyzePartitionCommand",
          "AnalyzeTablesCommand",
          "InsertIntoHadoopFsRelationCommand",
          "InsertIntoDataSourceCommand",
          "InsertIntoDataSourceDirCommand",
          "SaveIntoDataSourceCommand",
          "SaveAsV1TableCommand",
          "CreateHiveTableAsSelectCommand",
          "OptimizedCreateHiveTableAsSelectCommand",
          "InsertIntoHiveTable",
          "InsertIntoHiveDirCommand",
          // Delta's commands for the same statements on Delta tables.
          "CreateDeltaTableCommand",
          "WriteIntoDelta",
          "DeleteCommand",
          "UpdateCommand",
          "MergeIntoCommand",
          "TruncateDeltaTableCommand",
          "AlterTableAddColumnsDeltaCommand",
          "AlterTableChangeColumnDeltaCommand",
          "AlterTableReplaceColumnsDeltaCommand",
          "AlterTableDropColumnsDeltaCommand",
          "AlterTableSetPropertiesDeltaCommand",
          "AlterTableUnsetPropertiesDeltaCommand",
          "AlterTableAddConstraintDeltaCommand",
          "AlterTableDropConstraintDeltaCommand",
          "AlterTableSetLocationDeltaCommand");
  // The packages of the operators a query may be made of (Spark's own); any other is refused.
  private static final List<String> QUERY_PACKAGES =
      List.of(
          "org.apache.spark.sql.catalyst.plans.logical.",
          "org.apache.spark.sql.catalyst.catalog.",
          "org.apache.spark.sql.catalyst.analysis.",
          "org.apache.spark.sql.execution.datasources.",
          "org.apache.spark.sql.execution.");
  // Spark's operators that run code of the caller's that SQL can name: scripts (TRANSFORM ...
  // USING). Typed lambdas, Scala, Java and Python functions come only as Spark Connect
  // messages, which TokenInterceptor refuses before the server reads them (Delta's own plans use
  // typed operators).
  private static final Set<String> CODE_OPERATORS = Set.of("ScriptTransformation");
  // Fields of a command whose plan is what it changes, not what it reads.
  private static final Set<String> TARGET_FIELDS = Set.of("table", "target", "targetTable");

  private final SparkSession session;

  ReaderGuard(SparkSession session) {
    this.session = session;
  }

  @Override
  public BoxedUnit apply(LogicalPlan plan) {
    Walk walk = new Walk(Lake.of(session.sparkContext().conf()), session);
    walk.settings();
    walk.plan(plan);
    return BoxedUnit.UNIT;
  }

  /** The places a reader's session is held to. */
  record Lake(List<Places.Place> folders, Places.Place warehouse, Set<String> schemas) {
    static Lake of(SparkConf conf) {
      Set<String> schemas = new HashSet<>();
      for (String s : conf.get(SCHEMAS_CONF, "").split(",")) {
        if (!s.isBlank()) {
          schemas.add(s.strip().toLowerCase(Locale.ROOT));
        }
      }
      return new Lake(
          Places.list(conf.get(FOLDERS_CONF, "")),
          Places.of(conf.get(WAREHOUSE_CONF, null)),
          schemas);
    }

    boolean inLake(Places.Place place) {
      return place.underAny(folders);
    }
  }

  /** What a command changes: a name (schema null: a temporary view), a location, or both. */
  record Target(String schema, String name, String location) {
    String describe() {
      if (name != null) {
        return (schema == null ? "" : schema + ".") + name;
      }
      if (schema != null) {
        return "schema " + schema;
      }
      return String.valueOf(location);
    }
  }

  private static final class Walk {
    private final Lake lake;
    private final SparkSession session;

    Walk(Lake lake, SparkSession session) {
      this.lake = lake;
      this.session = session;
    }

    /**
     * Refuses a session holding a setting a reader may not choose: one a reader may not set
     * whose value is not the server's own (its Spark setting, its Hadoop setting, or its JVM's
     * system property of that name, which the SQL endpoint copies into its sessions).
     */
    void settings() {
      SparkConf server = session.sparkContext().conf();
      org.apache.hadoop.conf.Configuration hadoop = session.sparkContext().hadoopConfiguration();
      for (Map.Entry<String, String> e :
          scala.jdk.javaapi.CollectionConverters.asJava(
                  session.sessionState().conf().getAllConfs())
              .entrySet()) {
        String key = e.getKey();
        String value = String.valueOf(e.getValue());
        if (!SessionSettings.allowed(key)
            && !value.equals(server.get(key, null))
            && !value.equals(server.get("spark.hadoop." + key, null))
            && !value.equals(hadoop.get(key))
            && !value.equals(System.getProperty(key))) {
          throw refused("the session setting " + key, null);
        }
      }
    }

    void plan(LogicalPlan plan) {
      node(plan);
      for (Iterator<LogicalPlan> it = plan.children().iterator(); it.hasNext(); ) {
        plan(it.next());
      }
      for (Iterator<LogicalPlan> it = plan.subqueries().iterator(); it.hasNext(); ) {
        plan(it.next());
      }
      for (Iterator<Expression> it = plan.expressions().iterator(); it.hasNext(); ) {
        expression(it.next());
      }
    }

    private void expression(Expression e) {
      if (e instanceof CallMethodViaReflection) {
        throw refused("calling Java methods (reflect, java_method)", null);
      }
      // (Scala and Java functions are refused before they reach the server, by
      // TokenInterceptor; Delta's own plans use Scala UDFs.)
      String kind = e.getClass().getSimpleName();
      if (kind.startsWith("Python")) {
        throw refused("running code of the reader's (" + kind + ")", null);
      }
      for (Iterator<Expression> it = e.children().iterator(); it.hasNext(); ) {
        expression(it.next());
      }
    }

    private void node(LogicalPlan plan) {
      String kind = plan.getClass().getSimpleName();
      if (plan instanceof Command) {
        command(plan);
        return;
      }
      String name = plan.getClass().getName();
      if (QUERY_PACKAGES.stream().noneMatch(name::startsWith)) {
        throw refused("a plan of " + name, null);
      }
      if (CODE_OPERATORS.contains(kind)
          || kind.contains("Python")
          || kind.contains("Pandas")
          || kind.endsWith("InR")
          || kind.contains("InRWith")) {
        throw refused("running code of the reader's (" + plan.nodeName() + ")", null);
      }
      if (plan instanceof LogicalRelation relation) {
        if (relation.relation() instanceof HadoopFsRelation files) {
          read(files.location());
        } else {
          // Delta's own relations (table_changes' change feed) read a table of the lake.
          Path table = deltaPath(relation.relation(), 3);
          if (table == null) {
            throw refused("reading from " + relation.relation().getClass().getSimpleName(), null);
          }
          readPlace(table.toString());
        }
      } else if (plan instanceof HiveTableRelation hive) {
        Option<URI> at = hive.tableMeta().storage().locationUri();
        if (at.isDefined()) {
          readPlace(at.get().toString());
        }
      } else if (plan instanceof DataSourceV2Relation relation) {
        if (relation.table() instanceof FileTable files) {
          read(files.fileIndex());
        } else if (relation.identifier().isEmpty()) {
          throw refused("reading from " + relation.table().name(), null);
        }
      }
    }

    private void read(FileIndex index) {
      for (Iterator<Path> it = index.rootPaths().iterator(); it.hasNext(); ) {
        readPlace(it.next().toString());
      }
    }

    private void readPlace(String raw) {
      Places.Place place = Places.of(raw);
      if (place == null || !(lake.inLake(place) || place.under(lake.warehouse()))) {
        throw refused(
            "reading files outside the lake (" + raw + ")",
            "it reads the lake's tables and the tables of its own schemas");
      }
    }

    private void command(LogicalPlan command) {
      String kind = command.getClass().getSimpleName();
      if (kind.startsWith("Show") || kind.startsWith("Describe")) {
        return;
      }
      if (kind.equals("SetCommand")) {
        setting(command);
        return;
      }
      if (READ_COMMANDS.contains(kind)) {
        return;
      }
      if (!OWN_COMMANDS.contains(kind)) {
        throw refused(command.nodeName(), null);
      }
      List<Target> targets = new ArrayList<>();
      Product fields = (Product) command;
      Iterator<String> names = fields.productElementNames();
      Iterator<Object> values = fields.productIterator();
      Set<Object> children = new HashSet<>();
      for (Iterator<LogicalPlan> it = command.children().iterator(); it.hasNext(); ) {
        children.add(it.next());
      }
      boolean tempView =
          kind.equals("CreateTempView")
              || (kind.equals("CreateViewCommand")
                  && String.valueOf(field(command, "viewType")).contains("Temp"));
      while (names.hasNext() && values.hasNext()) {
        collect(names.next(), values.next(), targets, children, tempView);
      }
      if (targets.isEmpty()) {
        throw refused(command.nodeName(), null);
      }
      // Named targets first: the refusal names the table, not only its location.
      targets.sort((a, b) -> Boolean.compare(a.name() == null, b.name() == null));
      for (Target target : targets) {
        check(command, target, tempView);
      }
    }

    /** SET key=value of a key a reader may change; reading a setting is always admitted. */
    private void setting(LogicalPlan command) {
      Object kv = field(command, "kv");
      if (kv instanceof Option<?> pair && pair.isDefined() && pair.get() instanceof Tuple2<?, ?> t) {
        Object value = t._2();
        if (value instanceof Option<?> v && v.isDefined() && !SessionSettings.allowed((String) t._1())) {
          throw refused("setting " + t._1(), null);
        }
      }
    }

    private void collect(
        String field, Object value, List<Target> targets, Set<Object> children, boolean tempView) {
      if (value instanceof String location && (field.equals("location") || field.equals("path"))) {
        // SET LOCATION's new location, a schema's path: plain strings.
        targets.add(new Target(null, null, location));
      } else if (value instanceof Option<?> option) {
        if (option.isDefined()) {
          collect(field, option.get(), targets, children, tempView);
        }
      } else if (value instanceof LogicalPlan plan) {
        if (!nameNode(plan, targets) && !children.contains(plan)) {
          if (TARGET_FIELDS.contains(field)) {
            relations(plan, targets);
          } else {
            plan(plan); // what the command reads (a MERGE's source)
          }
        }
      } else if (value instanceof Iterable<?> many
          && !(value instanceof scala.collection.Map<?, ?>)) {
        for (Iterator<?> it = many.iterator(); it.hasNext(); ) {
          Object one = it.next();
          if (!(one instanceof String)) {
            collect(field, one, targets, children, tempView);
          }
        }
      } else if (value instanceof TableIdentifier id) {
        String schema = id.database().isDefined() ? id.database().get() : null;
        if (schema == null && !tempView) {
          schema = session.sessionState().catalog().getCurrentDatabase();
        }
        targets.add(new Target(schema, id.table(), null));
      } else if (value instanceof CatalogTable table) {
        TableIdentifier id = table.identifier();
        Option<URI> at = table.storage().locationUri();
        targets.add(
            new Target(
                id.database().isDefined() ? id.database().get() : null,
                id.table(),
                at.isDefined() ? at.get().toString() : null));
      } else if (value instanceof Identifier id) {
        targets.add(identifier(id, null));
      } else if (value instanceof Path path) {
        targets.add(new Target(null, null, path.toString()));
      } else if (value instanceof URI uri) {
        targets.add(new Target(null, null, uri.toString()));
      } else if (value instanceof CatalogStorageFormat storage) {
        if (storage.locationUri().isDefined()) {
          targets.add(new Target(null, null, storage.locationUri().get().toString()));
        }
      } else if (value instanceof TableSpecBase spec) {
        Object at = field(spec, "location");
        if (at instanceof Option<?> o && o.isDefined()) {
          targets.add(new Target(null, null, String.valueOf(o.get())));
        }
      } else if (value instanceof scala.collection.Map<?, ?> options) {
        for (String key : new String[] {"path", "location"}) {
          Option<?> at = lookup(options, key);
          if (at.isDefined()) {
            targets.add(new Target(null, null, String.valueOf(at.get())));
          }
        }
      } else if (value instanceof FileIndex index) {
        for (Iterator<Path> it = index.rootPaths().iterator(); it.hasNext(); ) {
          targets.add(new Target(null, null, it.next().toString()));
        }
      } else if (value != null && value.getClass().getName().startsWith(DELTA)) {
        // Delta's commands hold their table as its log, its file index or its DeltaTableV2.
        Path at = deltaPath(value, 2);
        if (at != null) {
          targets.add(new Target(null, null, at.toString()));
        }
        Object table = call(value, "catalogTable");
        if (table != null) {
          collect(field, table, targets, children, tempView);
        }
      }
    }

    /** A plan that names what a command acts on; adds its target and returns true. */
    private boolean nameNode(LogicalPlan plan, List<Target> targets) {
      if (plan instanceof ResolvedIdentifier r) {
        targets.add(identifier(r.identifier(), null));
      } else if (plan instanceof ResolvedTable r) {
        targets.add(identifier(r.identifier(), location(r.table())));
      } else if (plan instanceof ResolvedPersistentView r) {
        targets.add(identifier(r.identifier(), null));
      } else if (plan instanceof ResolvedTempView r) {
        targets.add(new Target(null, r.identifier().name(), null));
      } else if (plan instanceof ResolvedNamespace r) {
        Iterator<String> parts = r.namespace().iterator();
        String last = null;
        while (parts.hasNext()) {
          last = parts.next();
        }
        targets.add(new Target(last, null, null));
      } else if (plan instanceof DataSourceV2Relation r) {
        targets.add(
            r.identifier().isDefined()
                ? identifier(r.identifier().get(), location(r.table()))
                : new Target(null, null, location(r.table())));
      } else {
        return false;
      }
      return true;
    }

    /** The tables in a command's target plan (Delta's MERGE, UPDATE, DELETE hold one). */
    private void relations(LogicalPlan plan, List<Target> targets) {
      if (!nameNode(plan, targets)) {
        if (plan instanceof LogicalRelation relation) {
          Option<CatalogTable> table = relation.catalogTable();
          if (table.isDefined()) {
            collect("table", table.get(), targets, Set.of(), false);
          }
          if (relation.relation() instanceof HadoopFsRelation files) {
            collect("location", files.location(), targets, Set.of(), false);
          }
        } else if (plan instanceof HiveTableRelation hive) {
          collect("table", hive.tableMeta(), targets, Set.of(), false);
        }
      }
      for (Iterator<LogicalPlan> it = plan.children().iterator(); it.hasNext(); ) {
        relations(it.next(), targets);
      }
    }

    private Target identifier(Identifier id, String location) {
      String[] namespace = id.namespace();
      String schema = namespace.length == 0 ? null : namespace[namespace.length - 1];
      return new Target(schema, id.name(), location);
    }

    private static String location(Table table) {
      Path delta = deltaPath(table, 1);
      return delta != null ? delta.toString() : table.properties().get("location");
    }

    private void check(LogicalPlan command, Target target, boolean tempView) {
      if (target.schema() == null && target.location() == null && !tempView) {
        throw refused(command.nodeName() + " on " + target.describe(), null);
      }
      if (target.schema() != null
          && lake.schemas().contains(target.schema().toLowerCase(Locale.ROOT))) {
        throw refused(command.nodeName() + " on " + target.describe(), null);
      }
      if (target.location() != null) {
        Places.Place place = Places.of(target.location());
        if (place == null || lake.inLake(place) || !place.under(lake.warehouse())) {
          throw refused(
              command.nodeName()
                  + " on "
                  + target.describe()
                  + (target.name() != null ? " at " + target.location() : ""),
              null);
        }
      }
    }

    private RuntimeException refused(String what, String may) {
      String allowed =
          may != null
              ? may
              : "it reads every table, and creates, changes and drops tables and views only in"
                  + " schemas of its own (not "
                  + String.join(", ", new TreeSet<>(lake.schemas()))
                  + "), stored under the readers' warehouse";
      return sneaky(
          new AnalysisException(
              Refusal.message(what, allowed),
              Option.empty(),
              Option.empty(),
              Option.empty(),
              Option.empty(),
              scala.collection.immutable.Map$.MODULE$.empty(),
              new QueryContext[0]));
    }
  }

  /** Throw {@code e} (Spark's AnalysisException, which Java counts as checked) from anywhere. */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> RuntimeException sneaky(Throwable e) throws E {
    throw (E) e;
  }

  @SuppressWarnings("unchecked")
  private static Option<?> lookup(scala.collection.Map<?, ?> map, String key) {
    // Data source options are case-insensitive (CaseInsensitiveMap); a plain map is matched as
    // written and in lower case.
    Option<?> hit = ((scala.collection.Map<Object, ?>) map).get(key);
    if (hit.isDefined()) {
      return hit;
    }
    for (Iterator<?> it = map.keysIterator(); it.hasNext(); ) {
      Object k = it.next();
      if (k instanceof String s && s.equalsIgnoreCase(key)) {
        return ((scala.collection.Map<Object, ?>) map).get(k);
      }
    }
    return Option.empty();
  }

  private static Object field(Object product, String name) {
    if (!(product instanceof Product p)) {
      return null;
    }
    Iterator<String> names = p.productElementNames();
    Iterator<Object> values = p.productIterator();
    while (names.hasNext() && values.hasNext()) {
      Object value = values.next();
      if (names.next().equals(name)) {
        return value;
      }
    }
    return null;
  }

  /**
   * The table path of one of Delta's objects (a log, a snapshot, a relation over one), found
   * through its getters at most {@code depth} deep; null if it is none of Delta's or has none.
   */
  static Path deltaPath(Object delta, int depth) {
    if (delta == null || depth < 0 || !delta.getClass().getName().startsWith(DELTA)) {
      return null;
    }
    for (String getter : new String[] {"dataPath", "path"}) {
      if (call(delta, getter) instanceof Path path) {
        return path;
      }
    }
    for (String getter : new String[] {"deltaLog", "snapshot", "snapshotWithSchemaMode"}) {
      Path path = deltaPath(call(delta, getter), depth - 1);
      if (path != null) {
        return path;
      }
    }
    return null;
  }

  private static Object call(Object target, String getter) {
    try {
      Method method = target.getClass().getMethod(getter);
      return method.getParameterCount() == 0 ? method.invoke(target) : null;
    } catch (ReflectiveOperationException | RuntimeException e) {
      return null;
    }
  }
}
