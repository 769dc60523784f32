from pages._shared import page_header

page_header("kv_cache", "Coming soon.")
