#include "ggml.h"
#include <stdio.h>
int main(void) {
    printf("[\n");
    int first = 1;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *n = ggml_type_name((enum ggml_type)t);
        if (!n || ggml_blck_size((enum ggml_type)t) == 0) continue;
        printf("%s  {\"id\": %d, \"name\": \"%s\", \"block_size\": %lld, \"type_size\": %zu, \"is_quantized\": %s}",
            first ? "" : ",\n", t, n, (long long)ggml_blck_size((enum ggml_type)t), ggml_type_size((enum ggml_type)t),
            ggml_is_quantized((enum ggml_type)t) ? "true" : "false");
        first = 0;
    }
    printf("\n]\n");
    return 0;
}
