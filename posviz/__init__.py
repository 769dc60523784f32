"""posviz: the maths, models, data, training and evaluation behind the app (no Streamlit here)."""
import os

# Large CPU tensors on transparent huge pages. An attention map at 16 x the training length is 256 MB,
# and getting that much fresh memory from the kernel in 4 KB pages (a page fault per page) cost 57 ms
# here, a fifth of the forward pass it comes from; in 2 MB pages it costs 14 ms. PyTorch's CPU allocator
# asks for huge pages (allocations of 2 MB and more) when this is set before its first large allocation,
# so it is set when posviz is imported. Export THP_MEM_ALLOC_ENABLE=0 to opt out.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
