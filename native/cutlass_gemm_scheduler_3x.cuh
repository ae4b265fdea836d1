  // pyc_lab scheduler variant: the persistent tile scheduler's raster order and swizzle
  // (RasterOrderOptions: 0 Heuristic, 1 AlongM, 2 AlongN), and for the Stream-K scheduler
  // the decomposition (DecompositionMode: 0 Heuristic, 1 DataParallel, 2 SplitK, 3 StreamK)
  // and split count. Spliced into pyc_arguments() before it returns.
  args.scheduler.raster_order =
      static_cast<decltype(args.scheduler.raster_order)>(PYC_RASTER);
  args.scheduler.max_swizzle_size = PYC_SWIZZLE;
#if PYC_STREAMK
  args.scheduler.splits = PYC_SPLITS;
  args.scheduler.decomposition_mode =
      static_cast<decltype(args.scheduler.decomposition_mode)>(PYC_DECOMPOSITION);
#endif
