// The C++ RAII wrapper: self-join, A join B, CSR, streaming, exceptions from the engine
// and from a streaming callback.
#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "simjoin.hpp"

#define CHECK(cond)                                                               \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

using PairSet = std::set<std::pair<std::uint32_t, std::uint32_t>>;

int main() {
  // A 10 x 10 lattice with spacing 1: with eps = 1, each point pairs with its 4-neighbours.
  std::vector<double> grid;
  for (int y = 0; y < 10; y++)
    for (int x = 0; x < 10; x++) {
      grid.push_back(x);
      grid.push_back(y);
    }
  const std::size_t n = grid.size() / 2;
  PairSet want;
  for (std::uint32_t p = 0; p < n; p++) {
    if (p % 10 != 9) want.insert({p, p + 1});
    if (p + 10 < n) want.insert({p, p + 10});
  }

  simjoin::Engine engine;
  CHECK(simjoin::version() == SIMJOIN_VERSION_STRING);

  simjoin::Result r = engine.self_join(grid.data(), n, 2, simjoin::Options(1.0).sorted());
  PairSet got;
  for (auto p : r.pairs()) got.insert({p.i, p.j});
  CHECK(got == want && r.count() == want.size());
  CHECK(r.report().pairs == want.size());

  // An engine of its own with one CPU thread: same pairs; its report names the thread count.
  simjoin::Engine single(simjoin::EngineOptions().threads(1));
  auto one = single.self_join(grid.data(), n, 2, simjoin::Options(1.0).backend(SIMJOIN_BACKEND_CPU));
  CHECK(one.count() == want.size());
  CHECK(std::string(one.report().device).find("1 threads") != std::string::npos);

  auto table = engine.self_join(grid.data(), n, 2, simjoin::Options(1.0).output(SIMJOIN_OUTPUT_CSR));
  auto csr = table.csr();
  CHECK(csr.rows() == n && csr.neighbors.size() == 2 * want.size());
  CHECK(csr.offsets[1] - csr.offsets[0] == 2);  // corner point 0 has 2 neighbours

  // Neighbour counts: each point itself and its 4-neighbours (2 at a corner, 3 on an edge).
  auto counts = engine.neighbour_counts(grid.data(), n, 2, simjoin::Options(1.0));
  CHECK(counts.size() == n && counts[0] == 3 && counts[1] == 4 && counts[11] == 5);

  // A join B: B is the lattice shifted by (0.5, 0): in each row, A point x is exactly 0.5 from
  // B points x and x - 1 (10 + 9 pairs per row).
  std::vector<double> shifted = grid;
  for (std::size_t k = 0; k < shifted.size(); k += 2) shifted[k] += 0.5;
  auto ab = engine.join(grid.data(), n, shifted.data(), n, 2, simjoin::Options(0.5));
  CHECK(ab.count() == 10 * (10 + 9));

  // Haversine on the unit sphere: (0, 0) and (0, 1) are one degree (pi / 180) apart.
  std::vector<double> places = {0, 0, 0, 1};
  auto on = [&](double eps) {
    return engine.self_join(places.data(), 2, 2,
                            simjoin::Options(eps).metric(SIMJOIN_METRIC_HAVERSINE).sphere_radius(1.0))
        .count();
  };
  CHECK(on(0.01746) == 1 && on(0.01745) == 0);

  // Streaming collects the same pairs.
  PairSet streamed;
  auto counted = engine.self_join_stream(grid.data(), n, 2, simjoin::Options(1.0),
                                         [&](const simjoin::Pair *p, std::size_t k) {
                                           for (std::size_t q = 0; q < k; q++) streamed.insert({p[q].i, p[q].j});
                                           return true;
                                         });
  CHECK(streamed == want && counted.count() == want.size());

  // Errors become exceptions with the status and the engine's message.
  bool threw = false;
  try {
    engine.self_join(grid.data(), n, 2, simjoin::Options(-1.0));
  } catch (const simjoin::Error &e) {
    threw = e.status() == SIMJOIN_INVALID_ARGUMENT && std::string(e.what()).find("eps") != std::string::npos;
  }
  CHECK(threw);

  // A callback returning false cancels; a callback's exception is rethrown unchanged.
  threw = false;
  try {
    engine.self_join_stream(grid.data(), n, 2, simjoin::Options(1.0),
                            [](const simjoin::Pair *, std::size_t) { return false; });
  } catch (const simjoin::Error &e) {
    threw = e.status() == SIMJOIN_CANCELLED;
  }
  CHECK(threw);
  threw = false;
  try {
    engine.join_stream(grid.data(), n, shifted.data(), n, 2, simjoin::Options(1.0),
                       [](const simjoin::Pair *, std::size_t) -> bool { throw std::logic_error("from callback"); });
  } catch (const std::logic_error &e) {
    threw = std::string(e.what()) == "from callback";
  }
  CHECK(threw);

  std::printf("c++ wrapper: ok\n");
  return 0;
}
