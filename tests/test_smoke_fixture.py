from posviz.positions.rope_scaling import ROPE_SCALINGS
from posviz.models.checkpoint_files import load_checkpoint, read_metrics, shipped_checkpoints
from posviz.positions import method_names


def test_tiny_models_cover_every_method(tiny_models):
    found = shipped_checkpoints()
    assert list(found) == method_names()
    for name, folder in found.items():
        metrics = read_metrics(folder)
        table = metrics["eval"]["nonoverlapping_bpb"]
        assert set(table) == {"32", "64", "128", "256", "512"}
        if name == "learned":
            assert table["64"] is None and table["32"] is not None
        else:
            assert all(v is not None and 5.0 < v < 12.0 for v in table.values()), (name, table)
        assert load_checkpoint(folder).config.position == name
    assert set(read_metrics(found["rope"])["eval"]["rope_scalings"]) == set(ROPE_SCALINGS) - {"none"}
