// N elements of T moved by one aligned load or store (16 bytes at most).
template <typename T, int N>
struct alignas(sizeof(T) * N) pyc_vec {
    T v[N];
};
