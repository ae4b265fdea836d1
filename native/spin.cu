// A one-thread kernel that keeps its SM busy for `cycles` clock cycles (clock64 counts
// the SM clock). pyc_lab.profiling.timing queues it just before a timed interval's start
// event: while it spins, the host issues the start event, the timed work and the end
// event, so the GPU reaches the start event with all of that work already queued and the
// host's launch gaps stay out of the measured interval.
extern "C" __global__ void pyc_spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
