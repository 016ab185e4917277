/* The C example of docs/c.md: a self-join of five 2-D points. */
#include <stdio.h>

#include "simjoin.h"

int main(void) {
  const float points[] = {0.0f, 0.0f, 0.5f, 0.0f, 3.0f, 3.0f, 3.0f, 3.4f, 9.0f, 9.0f};
  simjoin_matrix data = {points, 5, 2, SIMJOIN_DTYPE_F32}; /* 5 points, 2 dims, borrowed */
  simjoin_options opts;
  simjoin_engine *engine = NULL;
  simjoin_result *result = NULL;
  const uint32_t *pairs;
  size_t count, k;
  char message[256];

  simjoin_options_init(&opts);
  opts.eps = 0.5;      /* pairs within Euclidean distance 0.5 */
  opts.sorted = 1;
  if (simjoin_engine_new(&engine) != SIMJOIN_OK ||
      simjoin_self_join(engine, &data, &opts, &result) != SIMJOIN_OK ||
      simjoin_result_pairs(result, &pairs, &count) != SIMJOIN_OK) {
    simjoin_last_error_message(message, sizeof message);
    fprintf(stderr, "simjoin: %s\n", message);
    simjoin_result_free(result);
    simjoin_engine_free(engine);
    return 1;
  }
  for (k = 0; k < count; k++) printf("%u %u\n", pairs[2 * k], pairs[2 * k + 1]);
  simjoin_result_free(result);
  simjoin_engine_free(engine);
  return 0;
}
