package lakehouse.server;

import java.lang.reflect.Method;
import java.net.URI;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;
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
import scala.collection.Iterable;
import scala.collection.Iterator;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * The check a reader's plans pass after Spark has analyzed them ({@link ReadOnlyExtension}), so
 * it sees every statement and DataFrame operation whatever the protocol (Spark Connect, the SQL
 * endpoint) before anything runs. For a session that is not the pipeline's ({@link Sessions}):
 *
 * <ul>
 *   <li>A command is refused unless it only reads (SHOW, DESCRIBE, EXPLAIN, SET, USE, CACHE ...)
 *       or everything it changes is the reader's own: a table, view or schema named outside the
 *       pipeline's schemas ({@code spark.lakehouse.pipelineSchemas}), and, where it has a
 *       location, at one under the metastore's warehouse ({@code spark.sql.warehouse.dir}) and not
 *       in the lake's folders of data ({@code spark.lakehouse.lakeFolders}). A command whose
 *       target cannot be told is refused.
 *   <li>Files are read only in the lake's folders and the warehouse (not the server's tokens,
 *       the lakehouse's home, or the machine's files); data sources other than files and the
 *       catalog's tables are refused (JDBC, whose options run statements of their own).
 *   <li>Python code (UDFs, mapInPandas and the like) and Java reflection (reflect, java_method)
 *       are refused: either would run code of the reader's own in the server. ADD JAR and CREATE
 *       FUNCTION are refused as commands.
 * </ul>
 *
 * The lake, the warehouse and the pipeline's schemas are read from the server's static settings
 * (its SparkConf), which a session cannot change.
 */
final class ReaderGuard extends AbstractFunction1<LogicalPlan, BoxedUnit> {
  static final String FOLDERS_CONF = "spark.lakehouse.lakeFolders";
  static final String SCHEMAS_CONF = "spark.lakehouse.pipelineSchemas";
  static final String WAREHOUSE_CONF = "spark.sql.warehouse.dir";
  private static final String DELTA = "org.apache.spark.sql.delta.";

  // Commands that change nothing: shown, described, explained, set for the session, cached.
  private static final Set<String> READ_ONLY =
      new HashSet<>(
          Arrays.asList(
              "SetCommand",
              "ResetCommand",
              "SetCatalogAndNamespace",
              "SetNamespaceCommand",
              "SetCatalogCommand",
              "CacheTable",
              "CacheTableAsSelect",
              "CacheTableCommand",
              "UncacheTable",
              "UncacheTableCommand",
              "ClearCacheCommand",
              "RefreshTable",
              "RefreshTableCommand",
              "RefreshResource",
              "ListFilesCommand",
              "ListJarsCommand",
              "ListArchivesCommand",
              "CreateVariable",
              "DropVariable",
              "SetVariable"));
  // Fields of a command whose plan is what it changes, not what it reads.
  private static final Set<String> TARGET_FIELDS =
      new HashSet<>(Arrays.asList("table", "target", "targetTable"));

  private final SparkSession session;

  ReaderGuard(SparkSession session) {
    this.session = session;
  }

  @Override
  public BoxedUnit apply(LogicalPlan plan) {
    if (Credentials.loaded() && !Sessions.isPipeline(session)) {
      new Walk(Lake.of(session.sparkContext().conf()), session).plan(plan);
    }
    return BoxedUnit.UNIT;
  }

  /** The places a reader's session is held to. */
  record Lake(List<Place> folders, Place warehouse, Set<String> schemas) {
    static Lake of(SparkConf conf) {
      List<Place> folders = new ArrayList<>();
      for (String f : conf.get(FOLDERS_CONF, "").split(",")) {
        Place place = Place.of(f.strip());
        if (place != null) {
          folders.add(place);
        }
      }
      Set<String> schemas = new HashSet<>();
      for (String s : conf.get(SCHEMAS_CONF, "").split(",")) {
        if (!s.isBlank()) {
          schemas.add(s.strip().toLowerCase(Locale.ROOT));
        }
      }
      return new Lake(folders, Place.of(conf.get(WAREHOUSE_CONF, null)), schemas);
    }

    /** Whether {@code place} is in one of the lake's folders of data. */
    boolean inLake(Place place) {
      return folders.stream().anyMatch(place::under);
    }
  }

  /** A location made comparable: scheme (s3 and s3n are s3a), bucket, normalized path. */
  record Place(String scheme, String authority, String path) {
    /** The place of {@code raw}, or null when it is none (empty, relative, or climbing out). */
    static Place of(String raw) {
      if (raw == null || raw.isBlank()) {
        return null;
      }
      URI uri;
      try {
        uri = new Path(raw).toUri().normalize();
      } catch (IllegalArgumentException e) {
        return null;
      }
      String path = uri.getPath();
      if (path == null || !path.startsWith("/") || path.contains("/../") || path.endsWith("/..")) {
        return null;
      }
      String scheme = uri.getScheme() == null ? "file" : uri.getScheme().toLowerCase(Locale.ROOT);
      if (scheme.equals("s3") || scheme.equals("s3n")) {
        scheme = "s3a";
      }
      String authority = scheme.equals("file") ? "" : String.valueOf(uri.getAuthority());
      String trimmed =
          path.length() > 1 && path.endsWith("/") ? path.substring(0, path.length() - 1) : path;
      return new Place(scheme, authority, trimmed);
    }

    boolean under(Place root) {
      return root != null
          && scheme.equals(root.scheme)
          && authority.equals(root.authority)
          && (path.equals(root.path)
              || path.startsWith(root.path.equals("/") ? "/" : root.path + "/"));
    }
  }

  /** What a command changes: a name (schema may be null: a temporary view), a location, both. */
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
      if (e.getClass().getSimpleName().startsWith("Python")) {
        throw refused("running Python code (a Python UDF)", null);
      }
      for (Iterator<Expression> it = e.children().iterator(); it.hasNext(); ) {
        expression(it.next());
      }
    }

    private void node(LogicalPlan plan) {
      String kind = plan.getClass().getSimpleName();
      if (kind.contains("Python") || kind.contains("Pandas") || kind.contains("Arrow")) {
        throw refused("running Python code (" + plan.nodeName() + ")", null);
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
      } else if (plan instanceof Command) {
        command(plan);
      }
    }

    private void read(FileIndex index) {
      for (Iterator<Path> it = index.rootPaths().iterator(); it.hasNext(); ) {
        readPlace(it.next().toString());
      }
    }

    private void readPlace(String raw) {
      Place place = Place.of(raw);
      if (place == null
          || !(lake.inLake(place) || place.under(lake.warehouse()))) {
        throw refused(
            "reading files outside the lake (" + raw + ")",
            "it reads the lake's tables and the tables of its own schemas");
      }
    }

    private void command(LogicalPlan command) {
      String kind = command.getClass().getSimpleName();
      if (kind.startsWith("Show") || kind.startsWith("Describe") || kind.equals("ExplainCommand")) {
        return;
      }
      if (kind.contains("Function") || (kind.startsWith("Add") && kind.endsWith("Command"))) {
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
          kind.equals("CreateViewCommand")
              && String.valueOf(field(command, "viewType")).contains("Temp");
      while (names.hasNext() && values.hasNext()) {
        String name = names.next();
        Object value = values.next();
        collect(name, value, targets, children, tempView);
      }
      if (READ_ONLY.contains(kind)) {
        return;
      }
      if (targets.isEmpty()) {
        throw refused(command.nodeName(), null);
      }
      // Named targets first: the refusal names the table, not only its location.
      targets.sort((a, b) -> Boolean.compare(a.name() == null, b.name() == null));
      for (Target target : targets) {
        check(command, target);
      }
    }

    private void collect(
        String field, Object value, List<Target> targets, Set<Object> children, boolean tempView) {
      if (value instanceof Option<?> option) {
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

    private void check(LogicalPlan command, Target target) {
      if (target.schema() != null
          && lake.schemas().contains(target.schema().toLowerCase(Locale.ROOT))) {
        throw refused(command.nodeName() + " on " + target.describe(), null);
      }
      if (target.location() != null) {
        Place place = Place.of(target.location());
        if (place == null || lake.inLake(place) || !place.under(lake.warehouse())) {
          throw refused(
              command.nodeName() + " on " + target.describe()
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
                  + String.join(", ", new java.util.TreeSet<>(lake.schemas()))
                  + "), stored under the metastore's warehouse";
      return sneaky(
          new AnalysisException(
          TokenInterceptor.refusal(what) + ": " + allowed,
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
