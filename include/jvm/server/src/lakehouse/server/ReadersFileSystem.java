package lakehouse.server;

import java.io.IOException;
import java.net.URI;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileChecksum;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FilterFileSystem;
import org.apache.hadoop.fs.LocatedFileStatus;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.hadoop.fs.PathHandle;
import org.apache.hadoop.fs.RemoteIterator;
import org.apache.hadoop.fs.XAttrSetFlag;
import org.apache.hadoop.fs.impl.OpenFileParameters;
import org.apache.hadoop.fs.permission.AclEntry;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.security.AccessControlException;
import org.apache.hadoop.util.Progressable;
import org.apache.hadoop.util.ReflectionUtils;

/**
 * The readers' server's file system, in front of the real one of each scheme (Hadoop's local file
 * system, S3A): it reads files only in the places {@value #READABLE} lists (the lake's folders,
 * the readers' warehouse, the server's scratch folder) and changes files only in those {@value
 * #WRITABLE} lists (the warehouse and the scratch folder). Every other call that would change a
 * file (create, append, delete, rename, mkdirs, truncate, concat, permissions, owners, times,
 * replication, links, snapshots, extended attributes, ACLs, storage policies, copies into it) and
 * every read of a file's content or a folder's listing elsewhere fails here with {@link
 * AccessControlException}, whatever statement asked for it: this is the layer below the SQL
 * check, which holds even when that check is bypassed.
 *
 * <p>For {@code s3a:} (and {@code s3:}) Hadoop makes this class itself ({@code fs.s3a.impl}); the
 * real file system's class is {@value #DELEGATE} with the scheme in place of {@code %s}. For
 * {@code file:}, {@link ReadersLocalFileSystem} puts it between Hadoop's local file system and
 * its checksums.
 */
public class ReadersFileSystem extends FilterFileSystem {
  static final String READABLE = "lakehouse.readers.readable";
  static final String WRITABLE = "lakehouse.readers.writable";
  static final String DELEGATE = "lakehouse.readers.fs.%s.impl";

  private List<Places.Place> readable = List.of();
  private List<Places.Place> writable = List.of();

  public ReadersFileSystem() {}

  ReadersFileSystem(FileSystem real) {
    super(real);
  }

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    if (fs == null) {
      String key = String.format(DELEGATE, name.getScheme());
      Class<?> real = conf.getClass(key, null);
      if (real == null) {
        throw new IOException(
            "the readers' file system has no file system for " + name.getScheme() + ": (" + key + ")");
      }
      fs = (FileSystem) ReflectionUtils.newInstance(real, conf);
      // (newInstance gives it its settings, so FilterFileSystem would take it as initialized.)
      fs.initialize(name, conf);
    }
    readable = Places.list(conf.get(READABLE));
    writable = Places.list(conf.get(WRITABLE));
    super.initialize(name, conf);
  }

  private Path changed(Path path) throws IOException {
    Places.Place place = place(path);
    if (place == null || !place.underAny(writable)) {
      throw new AccessControlException(
          "READ_ONLY_CREDENTIAL: changing "
              + path
              + " is refused: the readers' server changes no file of the lake, and writes only in"
              + " its warehouse ("
              + describe(writable)
              + ")");
    }
    return path;
  }

  private Path read(Path path) throws IOException {
    Places.Place place = place(path);
    if (place == null || !place.underAny(readable)) {
      throw new AccessControlException(
          "READ_ONLY_CREDENTIAL: reading "
              + path
              + " is refused: the readers' server reads only the lake and its warehouse ("
              + describe(readable)
              + ")");
    }
    return path;
  }

  private Places.Place place(Path path) {
    return Places.of(makeQualified(path).toUri());
  }

  private static String describe(List<Places.Place> places) {
    return String.join(", ", places.stream().map(Places.Place::toString).toList());
  }

  // -- reads ------------------------------------------------------------------------------

  @Override
  public FSDataInputStream open(Path f, int bufferSize) throws IOException {
    return super.open(read(f), bufferSize);
  }

  @Override
  public FSDataInputStream open(PathHandle fd, int bufferSize) throws IOException {
    throw new AccessControlException("READ_ONLY_CREDENTIAL: opening files by handle is refused");
  }

  @Override
  protected CompletableFuture<FSDataInputStream> openFileWithOptions(
      Path path, OpenFileParameters parameters) throws IOException {
    return super.openFileWithOptions(read(path), parameters);
  }

  @Override
  protected CompletableFuture<FSDataInputStream> openFileWithOptions(
      PathHandle handle, OpenFileParameters parameters) throws IOException {
    throw new AccessControlException("READ_ONLY_CREDENTIAL: opening files by handle is refused");
  }

  @Override
  public FileStatus[] listStatus(Path f) throws IOException {
    return super.listStatus(read(f));
  }

  @Override
  public RemoteIterator<FileStatus> listStatusIterator(Path f) throws IOException {
    return super.listStatusIterator(read(f));
  }

  @Override
  public RemoteIterator<LocatedFileStatus> listLocatedStatus(Path f) throws IOException {
    return super.listLocatedStatus(read(f));
  }

  @Override
  protected RemoteIterator<LocatedFileStatus> listLocatedStatus(Path f, PathFilter filter)
      throws IOException {
    return super.listLocatedStatus(read(f), filter);
  }

  @Override
  public FileChecksum getFileChecksum(Path f) throws IOException {
    return super.getFileChecksum(read(f));
  }

  @Override
  public FileChecksum getFileChecksum(Path f, long length) throws IOException {
    return super.getFileChecksum(read(f), length);
  }

  @Override
  public byte[] getXAttr(Path path, String name) throws IOException {
    return super.getXAttr(read(path), name);
  }

  @Override
  public Map<String, byte[]> getXAttrs(Path path) throws IOException {
    return super.getXAttrs(read(path));
  }

  @Override
  public Map<String, byte[]> getXAttrs(Path path, List<String> names) throws IOException {
    return super.getXAttrs(read(path), names);
  }

  @Override
  public List<String> listXAttrs(Path path) throws IOException {
    return super.listXAttrs(read(path));
  }

  // -- changes ----------------------------------------------------------------------------

  @Override
  public FSDataOutputStream create(
      Path f,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    return super.create(
        changed(f), permission, overwrite, bufferSize, replication, blockSize, progress);
  }

  @Override
  public FSDataOutputStream create(
      Path f,
      FsPermission permission,
      EnumSet<CreateFlag> flags,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress,
      Options.ChecksumOpt checksumOpt)
      throws IOException {
    return super.create(
        changed(f), permission, flags, bufferSize, replication, blockSize, progress, checksumOpt);
  }

  @Override
  public FSDataOutputStream createNonRecursive(
      Path f,
      FsPermission permission,
      EnumSet<CreateFlag> flags,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    return super.createNonRecursive(
        changed(f), permission, flags, bufferSize, replication, blockSize, progress);
  }

  @Override
  protected FSDataOutputStream primitiveCreate(
      Path f,
      FsPermission absolutePermission,
      EnumSet<CreateFlag> flag,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress,
      Options.ChecksumOpt checksumOpt)
      throws IOException {
    return super.primitiveCreate(
        changed(f),
        absolutePermission,
        flag,
        bufferSize,
        replication,
        blockSize,
        progress,
        checksumOpt);
  }

  @Override
  public FSDataOutputStreamBuilder createFile(Path path) {
    return new Checked(this, path).create().overwrite(true);
  }

  @Override
  public FSDataOutputStreamBuilder appendFile(Path path) {
    return new Checked(this, path).append();
  }

  @Override
  public FSDataOutputStream append(Path f, int bufferSize, Progressable progress)
      throws IOException {
    return super.append(changed(f), bufferSize, progress);
  }

  @Override
  public void concat(Path trg, Path[] psrcs) throws IOException {
    changed(trg);
    for (Path src : psrcs) {
      changed(src);
    }
    super.concat(trg, psrcs);
  }

  @Override
  public boolean setReplication(Path src, short replication) throws IOException {
    return super.setReplication(changed(src), replication);
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    return super.rename(changed(src), changed(dst));
  }

  @Override
  protected void rename(Path src, Path dst, Options.Rename... options) throws IOException {
    super.rename(changed(src), changed(dst), options);
  }

  @Override
  public boolean truncate(Path f, long newLength) throws IOException {
    return super.truncate(changed(f), newLength);
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    return super.delete(changed(f), recursive);
  }

  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    return super.mkdirs(changed(f), permission);
  }

  @Override
  public boolean mkdirs(Path f) throws IOException {
    return super.mkdirs(changed(f));
  }

  @Override
  protected boolean primitiveMkdir(Path f, FsPermission absolutePermission) throws IOException {
    return super.primitiveMkdir(changed(f), absolutePermission);
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    super.copyFromLocalFile(delSrc, src, changed(dst));
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, boolean overwrite, Path[] srcs, Path dst)
      throws IOException {
    super.copyFromLocalFile(delSrc, overwrite, srcs, changed(dst));
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, boolean overwrite, Path src, Path dst)
      throws IOException {
    super.copyFromLocalFile(delSrc, overwrite, src, changed(dst));
  }

  @Override
  public void copyToLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    super.copyToLocalFile(delSrc, delSrc ? changed(src) : read(src), dst);
  }

  @Override
  public Path startLocalOutput(Path fsOutputFile, Path tmpLocalFile) throws IOException {
    return super.startLocalOutput(changed(fsOutputFile), tmpLocalFile);
  }

  @Override
  public void completeLocalOutput(Path fsOutputFile, Path tmpLocalFile) throws IOException {
    super.completeLocalOutput(changed(fsOutputFile), tmpLocalFile);
  }

  @Override
  public void createSymlink(Path target, Path link, boolean createParent) throws IOException {
    super.createSymlink(target, changed(link), createParent);
  }

  @Override
  public void setOwner(Path p, String username, String groupname) throws IOException {
    super.setOwner(changed(p), username, groupname);
  }

  @Override
  public void setTimes(Path p, long mtime, long atime) throws IOException {
    super.setTimes(changed(p), mtime, atime);
  }

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    super.setPermission(changed(p), permission);
  }

  @Override
  public Path createSnapshot(Path path, String snapshotName) throws IOException {
    return super.createSnapshot(changed(path), snapshotName);
  }

  @Override
  public void renameSnapshot(Path path, String snapshotOldName, String snapshotNewName)
      throws IOException {
    super.renameSnapshot(changed(path), snapshotOldName, snapshotNewName);
  }

  @Override
  public void deleteSnapshot(Path path, String snapshotName) throws IOException {
    super.deleteSnapshot(changed(path), snapshotName);
  }

  @Override
  public void modifyAclEntries(Path path, List<AclEntry> aclSpec) throws IOException {
    super.modifyAclEntries(changed(path), aclSpec);
  }

  @Override
  public void removeAclEntries(Path path, List<AclEntry> aclSpec) throws IOException {
    super.removeAclEntries(changed(path), aclSpec);
  }

  @Override
  public void removeDefaultAcl(Path path) throws IOException {
    super.removeDefaultAcl(changed(path));
  }

  @Override
  public void removeAcl(Path path) throws IOException {
    super.removeAcl(changed(path));
  }

  @Override
  public void setAcl(Path path, List<AclEntry> aclSpec) throws IOException {
    super.setAcl(changed(path), aclSpec);
  }

  @Override
  public void setXAttr(Path path, String name, byte[] value) throws IOException {
    super.setXAttr(changed(path), name, value);
  }

  @Override
  public void setXAttr(Path path, String name, byte[] value, EnumSet<XAttrSetFlag> flag)
      throws IOException {
    super.setXAttr(changed(path), name, value, flag);
  }

  @Override
  public void removeXAttr(Path path, String name) throws IOException {
    super.removeXAttr(changed(path), name);
  }

  @Override
  public void satisfyStoragePolicy(Path path) throws IOException {
    super.satisfyStoragePolicy(changed(path));
  }

  @Override
  public void setStoragePolicy(Path src, String policyName) throws IOException {
    super.setStoragePolicy(changed(src), policyName);
  }

  @Override
  public void unsetStoragePolicy(Path src) throws IOException {
    super.unsetStoragePolicy(changed(src));
  }

  /**
   * The builder {@link #createFile} and {@link #appendFile} return: it builds through this file
   * system's own create and append, which hold it to the writable places (the real file system's
   * builder would write past them).
   */
  private static final class Checked
      extends FSDataOutputStreamBuilder<FSDataOutputStream, Checked> {
    Checked(FileSystem fs, Path path) {
      super(fs, path);
    }

    @Override
    public Checked getThisBuilder() {
      return this;
    }

    @Override
    public FSDataOutputStream build() throws IOException {
      FileSystem fs = getFS();
      EnumSet<CreateFlag> flags = getFlags();
      if (flags.contains(CreateFlag.CREATE) || flags.contains(CreateFlag.OVERWRITE)) {
        return isRecursive()
            ? fs.create(
                getPath(),
                getPermission(),
                flags,
                getBufferSize(),
                getReplication(),
                getBlockSize(),
                getProgress(),
                getChecksumOpt())
            : fs.createNonRecursive(
                getPath(),
                getPermission(),
                flags,
                getBufferSize(),
                getReplication(),
                getBlockSize(),
                getProgress());
      }
      if (flags.contains(CreateFlag.APPEND)) {
        return fs.append(getPath(), getBufferSize(), getProgress());
      }
      throw new IOException("a file is built with create or append: " + flags);
    }
  }
}
