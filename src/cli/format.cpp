#include "cli/format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "cli/signals.h"
#include "common/error.h"

namespace kvgen {

std::string human_bytes(double bytes) {
    static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        ++u;
    }
    if (u == 0) return fmt::format("{:.0f} B", bytes);
    if (bytes >= 100.0) return fmt::format("{:.0f} {}", bytes, units[u]);
    if (bytes >= 10.0) return fmt::format("{:.1f} {}", bytes, units[u]);
    return fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string human_count(double n) {
    if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
    if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
    if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
    return fmt::format("{:.0f}", n);
}

namespace {
// The file a path names once symbolic links are followed (they may point to one that does not exist yet); the path
// itself when it is not a link.
std::string link_target(std::string path) {
    for (int hops = 0; hops < 40; ++hops) {
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) break;
        std::string to(size_t(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
        const ssize_t n = ::readlink(path.c_str(), to.data(), to.size());
        if (n <= 0 || size_t(n) >= to.size()) break;
        to.resize(size_t(n));
        const size_t slash = path.find_last_of('/');
        path = to[0] == '/' || slash == std::string::npos ? to : path.substr(0, slash + 1) + to;
    }
    return path;
}

std::string dir_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

void check_writable(const std::string& path) {
    if (path == "-") return;
    if (path.empty()) throw Error("output path is empty");
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) throw Error(fmt::format("{}: is a directory", path));
        if (::access(path.c_str(), W_OK) != 0)
            throw Error(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
        if (!S_ISREG(st.st_mode)) return;  // written directly (OutputFile)
    }
    const std::string dir = dir_of(link_target(path));  // the temporary goes beside a link's target
    if (::access(dir.c_str(), W_OK) != 0)
        throw Error(fmt::format("{}: cannot write (directory '{}': {})", path, dir, std::strerror(errno)));
}

std::string read_text_file(const std::string& path) {
    const bool std_in = path == "-";
    const std::string name = std_in ? "standard input" : path;
    const int fd = std_in ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    auto close_fd = [fd, std_in] {
        if (!std_in) ::close(fd);
    };
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        close_fd();
        throw Error(fmt::format("{}: is a directory", name));
    }
    std::string out;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n == 0) break;
        if (n < 0) {
            if (errno == EINTR) continue;
            const int e = errno;
            close_fd();
            throw Error(fmt::format("{}: read failed: {}", name, std::strerror(e)));
        }
        out.append(buf, size_t(n));
    }
    close_fd();
    return out;
}

OutputFile::OutputFile(const std::string& path) : path_(path) {
    if (path == "-") {
        std::fflush(stdout);  // what stdio holds goes first
        fd_ = STDOUT_FILENO;
        return;
    }
    if (path.empty()) throw Error("output path is empty");
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode)) throw Error(fmt::format("{}: is a directory", path));
        // note: O_NONBLOCK, so that a FIFO nobody reads is an error (ENXIO) instead of a wait; cleared after
        fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd_ < 0)
            throw Error(fmt::format("{}: cannot open: {}", path,
                                    errno == ENXIO ? "a FIFO that nobody reads" : std::strerror(errno)));
        ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
        return;
    }
    target_ = link_target(path);  // replace what a symbolic link points to (even one that does not exist yet)
    if (::access(path.c_str(), F_OK) == 0) {
        mode_ = st.st_mode & 07777;  // keeping its mode
    } else {
        const mode_t mask = ::umask(0);  // a new file as open(2) would make it
        ::umask(mask);
        mode_ = 0666 & ~mask;
    }
    tmp_ = target_ + ".tmp.XXXXXX";
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) throw Error(fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
    slot_ = register_temporary(tmp_);
}

OutputFile::~OutputFile() {
    if (fd_ < 0) return;  // committed
    if (fd_ != STDOUT_FILENO) ::close(fd_);
    if (!tmp_.empty()) {
        ::unlink(tmp_.c_str());
        unregister_temporary(slot_);
    }
}

void OutputFile::write(const void* data, size_t n) {
    KVGEN_ASSERT(fd_ >= 0);
    const char* p = static_cast<const char*>(data);
    for (size_t done = 0; done < n;) {
        const ssize_t w = ::write(fd_, p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(w < 0 ? errno : EIO)));
        done += size_t(w);
    }
}

void OutputFile::commit() {
    KVGEN_ASSERT(fd_ >= 0);
    if (tmp_.empty()) {  // stdout, or written directly
        const int fd = fd_;
        fd_ = -1;
        if (fd != STDOUT_FILENO && ::close(fd) != 0)
            throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
        return;
    }
    const bool ok =
        ::fchmod(fd_, mode_) == 0 && ::close(fd_) == 0 && ::rename(tmp_.c_str(), target_.c_str()) == 0;
    const int e = errno;
    fd_ = -1;
    if (!ok) ::unlink(tmp_.c_str());
    unregister_temporary(slot_);
    if (!ok) throw Error(fmt::format("{}: cannot finish writing: {}", path_, std::strerror(e)));
}

bool write_stdout(const std::string& text, int* error) {
    if (std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0) return true;
    if (errno != EPIPE) *error = errno;
    return false;
}

void write_text_file(const std::string& path, const std::string& text) {
    OutputFile f(path);
    f.write(text.data(), text.size());
    f.commit();
}

}  // namespace kvgen
