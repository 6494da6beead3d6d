// placeholder while being written
#include <cstdio>
int main() { std::puts("not written yet"); return 1; }
