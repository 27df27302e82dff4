#include <asm-generic/bitsperlong.h>
