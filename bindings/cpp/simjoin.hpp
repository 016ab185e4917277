// simjoin.hpp: a header-only C++17 RAII wrapper over the C API in simjoin.h.
//
//   simjoin::Engine engine;
//   auto result = engine.self_join(points.data(), n, dim, simjoin::Options(0.5).sorted());
//   for (auto [i, j] : result.pairs()) ...
//
// Failures throw simjoin::Error (status + the engine's message). Engine may be shared
// between threads; Result is immutable and movable.
#ifndef SIMJOIN_HPP
#define SIMJOIN_HPP

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "simjoin.h"

namespace simjoin {

class Error : public std::runtime_error {
 public:
  Error(simjoin_status status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  simjoin_status status() const noexcept { return status_; }

 private:
  simjoin_status status_;
};

namespace detail {
inline std::string last_error() {
  std::string msg(simjoin_last_error_message(nullptr, 0), '\0');
  if (!msg.empty()) simjoin_last_error_message(&msg[0], msg.size() + 1);
  return msg;
}
inline void check(simjoin_status status) {
  if (status != SIMJOIN_OK) throw Error(status, last_error());
}
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr simjoin_dtype value = SIMJOIN_DTYPE_F32; };
template <> struct dtype_of<double> { static constexpr simjoin_dtype value = SIMJOIN_DTYPE_F64; };
template <class T> simjoin_matrix matrix(const T *data, std::size_t rows, std::size_t cols) {
  return simjoin_matrix{data, rows, cols, dtype_of<T>::value};
}
}  // namespace detail

/// Join options with chainable setters: Options(0.5).metric(SIMJOIN_METRIC_MANHATTAN).
class Options {
 public:
  explicit Options(double eps) {
    detail::check(simjoin_options_init(&raw_));
    raw_.eps = eps;
  }
  Options &metric(simjoin_metric m) { raw_.metric = m; return *this; }
  Options &backend(simjoin_backend b) { raw_.backend = b; return *this; }
  Options &algorithm(simjoin_algorithm a) { raw_.algorithm = a; return *this; }
  Options &output(simjoin_output o) { raw_.output = o; return *this; }
  Options &sorted(bool on = true) { raw_.sorted = on; return *this; }
  Options &include_self(bool on = true) { raw_.include_self = on; return *this; }
  /// SIMJOIN_METRIC_HAVERSINE: the sphere's radius in metres (default: the Earth's).
  Options &sphere_radius(double metres) { raw_.sphere_radius = metres; return *this; }
  const simjoin_options *get() const noexcept { return &raw_; }

 private:
  simjoin_options raw_;
};

/// Engine options: the device the engine owns, CPU threads, validation.
class EngineOptions {
 public:
  EngineOptions() { detail::check(simjoin_engine_options_init(&raw_)); }
  /// Device index or name substring; the string must live until the engine is created.
  EngineOptions &device(const char *selector) { raw_.device = selector; return *this; }
  EngineOptions &threads(std::uint64_t n) { raw_.threads = n; return *this; }
  EngineOptions &validation(bool on) {
    raw_.validation = on ? SIMJOIN_VALIDATION_ON : SIMJOIN_VALIDATION_OFF;
    return *this;
  }
  const simjoin_engine_options *get() const noexcept { return &raw_; }

 private:
  simjoin_engine_options raw_;
};

/// One pair (i, j), laid out as the C API's pair arrays.
struct Pair {
  std::uint32_t i, j;
};
static_assert(sizeof(Pair) == 2 * sizeof(std::uint32_t), "Pair must match the C layout");

/// A borrowed contiguous range (begin/end/size/operator[]), valid while its owner lives.
template <class T> class View {
 public:
  View(const T *data, std::size_t size) : data_(data), size_(size) {}
  const T *begin() const noexcept { return data_; }
  const T *end() const noexcept { return data_ + size_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  const T &operator[](std::size_t k) const noexcept { return data_[k]; }

 private:
  const T *data_;
  std::size_t size_;
};

/// CSR neighbour table: row r's neighbours are neighbors[offsets[r] .. offsets[r+1]].
struct Csr {
  View<std::uint64_t> offsets;
  View<std::uint32_t> neighbors;
  std::size_t rows() const noexcept { return offsets.size() - 1; }
};

class Result {
 public:
  explicit Result(simjoin_result *raw) : raw_(raw) {}
  simjoin_output output() const noexcept { return simjoin_result_output(raw_.get()); }
  std::uint64_t count() const noexcept { return simjoin_result_count(raw_.get()); }
  // The views below borrow from this Result: calling them on a temporary would dangle.
  View<Pair> pairs() const && = delete;
  Csr csr() const && = delete;

  /// The pairs of a PAIRS result (throws Error otherwise).
  View<Pair> pairs() const & {
    const std::uint32_t *p = nullptr;
    std::size_t n = 0;
    detail::check(simjoin_result_pairs(raw_.get(), &p, &n));
    return View<Pair>(reinterpret_cast<const Pair *>(p), n);
  }
  /// The table of a CSR result (throws Error otherwise).
  Csr csr() const & {
    const std::uint64_t *offsets = nullptr;
    const std::uint32_t *neighbors = nullptr;
    std::size_t rows = 0, nnz = 0;
    detail::check(simjoin_result_csr(raw_.get(), &offsets, &rows, &neighbors, &nnz));
    return Csr{View<std::uint64_t>(offsets, rows + 1), View<std::uint32_t>(neighbors, nnz)};
  }
  simjoin_report report() const {
    simjoin_report r;
    detail::check(simjoin_result_report(raw_.get(), &r));
    return r;
  }
  const simjoin_result *get() const noexcept { return raw_.get(); }

 private:
  struct Free {
    void operator()(simjoin_result *r) const noexcept { simjoin_result_free(r); }
  };
  std::unique_ptr<simjoin_result, Free> raw_;
};

class Engine {
 public:
  Engine() {
    simjoin_engine *raw = nullptr;
    detail::check(simjoin_engine_new(&raw));
    raw_.reset(raw);
  }

  /// An engine that owns the device and threads `opts` name (released with the engine).
  explicit Engine(const EngineOptions &opts) {
    simjoin_engine *raw = nullptr;
    detail::check(simjoin_engine_new_with(opts.get(), &raw));
    raw_.reset(raw);
  }

  /// Self-join of `rows` points of `cols` coordinates (row-major float or double).
  template <class T>
  Result self_join(const T *data, std::size_t rows, std::size_t cols, const Options &opts) const {
    simjoin_matrix m = detail::matrix(data, rows, cols);
    simjoin_result *out = nullptr;
    detail::check(simjoin_self_join(raw_.get(), &m, opts.get(), &out));
    return Result(out);
  }

  /// A join B: pairs (i in A, j in B).
  template <class T>
  Result join(const T *a, std::size_t rows_a, const T *b, std::size_t rows_b, std::size_t cols,
              const Options &opts) const {
    simjoin_matrix ma = detail::matrix(a, rows_a, cols), mb = detail::matrix(b, rows_b, cols);
    simjoin_result *out = nullptr;
    detail::check(simjoin_join(raw_.get(), &ma, &mb, opts.get(), &out));
    return Result(out);
  }

  /// Each row's number of rows within the options' eps, itself included (see
  /// simjoin_neighbour_counts: on a GPU counted on the device, no pairs).
  template <class T>
  std::vector<std::uint32_t> neighbour_counts(const T *data, std::size_t rows, std::size_t cols,
                                              const Options &opts) const {
    simjoin_matrix m = detail::matrix(data, rows, cols);
    std::vector<std::uint32_t> counts(rows);
    detail::check(simjoin_neighbour_counts(raw_.get(), &m, opts.get(), counts.data(), nullptr));
    return counts;
  }

  /// Streaming self-join: `on_chunk(const Pair *pairs, std::size_t count)` receives the
  /// pairs as batches finish; return false to stop (throws Error with SIMJOIN_CANCELLED).
  /// An exception thrown by `on_chunk` stops the join and is rethrown here.
  template <class T, class F>
  Result self_join_stream(const T *data, std::size_t rows, std::size_t cols, const Options &opts,
                          F &&on_chunk) const {
    simjoin_matrix m = detail::matrix(data, rows, cols);
    Trampoline<F> t{on_chunk, nullptr};
    simjoin_result *out = nullptr;
    simjoin_status status =
        simjoin_self_join_stream(raw_.get(), &m, opts.get(), &Trampoline<F>::call, &t, &out);
    if (t.error) std::rethrow_exception(t.error);
    detail::check(status);
    return Result(out);
  }

  /// Streaming A join B; see self_join_stream.
  template <class T, class F>
  Result join_stream(const T *a, std::size_t rows_a, const T *b, std::size_t rows_b,
                     std::size_t cols, const Options &opts, F &&on_chunk) const {
    simjoin_matrix ma = detail::matrix(a, rows_a, cols), mb = detail::matrix(b, rows_b, cols);
    Trampoline<F> t{on_chunk, nullptr};
    simjoin_result *out = nullptr;
    simjoin_status status =
        simjoin_join_stream(raw_.get(), &ma, &mb, opts.get(), &Trampoline<F>::call, &t, &out);
    if (t.error) std::rethrow_exception(t.error);
    detail::check(status);
    return Result(out);
  }

  const simjoin_engine *get() const noexcept { return raw_.get(); }

 private:
  // Exceptions must not unwind through the C library: catch them here, stop the join,
  // and rethrow once the C call has returned.
  template <class F> struct Trampoline {
    F &fn;
    std::exception_ptr error;
    static int call(void *self, const std::uint32_t *pairs, std::size_t count) noexcept {
      auto *t = static_cast<Trampoline *>(self);
      try {
        return t->fn(reinterpret_cast<const Pair *>(pairs), count) ? 0 : 1;
      } catch (...) {
        t->error = std::current_exception();
        return 1;
      }
    }
  };
  struct Free {
    void operator()(simjoin_engine *e) const noexcept { simjoin_engine_free(e); }
  };
  std::unique_ptr<simjoin_engine, Free> raw_;
};

/// The library's version string ("MAJOR.MINOR.PATCH").
inline std::string version() { return simjoin_version(); }

}  // namespace simjoin

#endif  // SIMJOIN_HPP
