package lakehouse.server;

import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import org.apache.hadoop.fs.Path;

/**
 * Locations made comparable, and the lists of them the readers' server is held to. A location is
 * its scheme ({@code s3} and {@code s3n} count as {@code s3a}, no scheme as {@code file}), its
 * bucket, and its path with {@code .} and {@code ..} resolved; a local path is also resolved
 * through symbolic links and aliases such as {@code /proc/self/root} (by its nearest folder that
 * exists), so that no spelling of a path reaches a place another spelling is refused.
 */
final class Places {
  private Places() {}

  /** One location. */
  record Place(String scheme, String authority, String path) {
    /** Whether this place is {@code root} or inside it. */
    boolean under(Place root) {
      return root != null
          && scheme.equals(root.scheme)
          && authority.equals(root.authority)
          && (path.equals(root.path)
              || path.startsWith(root.path.equals("/") ? "/" : root.path + "/"));
    }

    /** Whether this place is inside any of {@code roots}. */
    boolean underAny(List<Place> roots) {
      return roots.stream().anyMatch(this::under);
    }

    @Override
    public String toString() {
      return scheme.equals("file") ? path : scheme + "://" + authority + path;
    }
  }

  /**
   * The place {@code raw} names, or null when it names none: empty, relative, not a URI, or with
   * a scheme other than {@code file}, {@code s3}, {@code s3a} and {@code s3n}.
   */
  static Place of(String raw) {
    if (raw == null || raw.isBlank()) {
      return null;
    }
    URI uri;
    try {
      uri = new Path(raw.strip()).toUri().normalize();
    } catch (IllegalArgumentException e) {
      return null;
    }
    return of(uri);
  }

  /** The place of {@code uri}, or null (see {@link #of(String)}). */
  static Place of(URI uri) {
    String path = uri.normalize().getPath();
    if (path == null || !path.startsWith("/") || path.equals("/..") || path.startsWith("/../")) {
      return null;
    }
    String scheme = uri.getScheme() == null ? "file" : uri.getScheme().toLowerCase(Locale.ROOT);
    if (scheme.equals("s3") || scheme.equals("s3n")) {
      scheme = "s3a";
    }
    if (!scheme.equals("file") && !scheme.equals("s3a")) {
      return null;
    }
    String authority = "";
    if (scheme.equals("file")) {
      path = real(path);
    } else {
      if (uri.getAuthority() == null) {
        return null;
      }
      authority = uri.getAuthority().toLowerCase(Locale.ROOT);
    }
    String trimmed =
        path.length() > 1 && path.endsWith("/") ? path.substring(0, path.length() - 1) : path;
    return new Place(scheme, authority, trimmed);
  }

  /** The places of a comma-separated list of locations (those that name none are left out). */
  static List<Place> list(String csv) {
    List<Place> places = new ArrayList<>();
    if (csv != null) {
      for (String one : csv.split(",")) {
        Place place = of(one);
        if (place != null) {
          places.add(place);
        }
      }
    }
    return places;
  }

  /**
   * A local path as the machine resolves it: its nearest folder that exists, through links, and
   * the rest of the path after it.
   */
  private static String real(String path) {
    java.nio.file.Path asked = java.nio.file.Path.of(path).normalize();
    java.nio.file.Path existing = asked;
    while (existing != null && !Files.exists(existing, LinkOption.NOFOLLOW_LINKS)) {
      existing = existing.getParent();
    }
    if (existing == null) {
      return asked.toString();
    }
    try {
      return existing.toRealPath().resolve(existing.relativize(asked)).normalize().toString();
    } catch (IOException | SecurityException e) {
      return asked.toString();
    }
  }
}
