#include "cli/format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

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
std::string dir_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

void check_writable(const std::string& path) {
    if (path == "-") return;
    if (path.empty()) throw Error("output path is empty");
    const std::string dir = dir_of(path);
    if (::access(dir.c_str(), W_OK) != 0)
        throw Error(fmt::format("{}: cannot write (directory '{}': {})", path, dir, std::strerror(errno)));
    if (::access(path.c_str(), F_OK) == 0 && ::access(path.c_str(), W_OK) != 0)
        throw Error(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
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

void write_text_file(const std::string& path, const std::string& text) {
    if (path == "-") {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
        return;
    }
    std::string tmp = path + ".tmp.XXXXXX";
    const int fd = ::mkstemp(tmp.data());
    if (fd < 0) throw Error(fmt::format("{}: cannot create: {}", path, std::strerror(errno)));
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            const int e = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            throw Error(fmt::format("{}: write failed: {}", path, std::strerror(e)));
        }
        done += size_t(n);
    }
    if (::fchmod(fd, 0644) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        throw Error(fmt::format("{}: cannot finish writing: {}", path, std::strerror(e)));
    }
}

}  // namespace kvgen
