"""loaderx: a persistent record store with per-record zstd compression and
zero-copy batch gathering, plus an endless, resumable, sharded data loader.

    from loaderx.zrecord import Zrecord, DenseStore, RaggedStore, train_dict, ZrecordError
    from loaderx.zsampler import Sampler
    from loaderx.dataset import from_numpy, from_iterator, open_store, pad
    from loaderx.dataloader import DataLoader
"""
__version__ = "0.1.0"
