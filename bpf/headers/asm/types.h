/* Both targets (amd64, arm64) use the generic 64-bit integer types. */
#include <asm-generic/int-ll64.h>
