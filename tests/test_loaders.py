"""The real-data loaders on small files written in each real format (local, gzip, fsspec memory://)."""
import gzip

import fsspec
import numpy as np
import pytest
import scipy.sparse as sp

from dscar import InvalidInputError
from dscar.algorithms import loaders

# (user, item, rating, timestamp) with ids as the files have them: 1-based, with gaps
ROWS = [(196, 242, 3, 881250949), (186, 302, 3.5, 891717742), (22, 377, 1, 878887116), (196, 51, 2, 880606923),
        (22, 242, 5, 886397596)]


def _check_ratings(r):
    np.testing.assert_array_equal(r.user_ids, [22, 186, 196])
    np.testing.assert_array_equal(r.item_ids, [51, 242, 302, 377])
    np.testing.assert_array_equal(r.user_ids[r.users], [row[0] for row in ROWS])
    np.testing.assert_array_equal(r.item_ids[r.items], [row[1] for row in ROWS])
    np.testing.assert_array_equal(r.ratings, [row[2] for row in ROWS])
    np.testing.assert_array_equal(r.timestamps, [row[3] for row in ROWS])
    u, i, x = r  # unpacks like the (users, items, ratings) MF.fit takes
    assert u is r.users and x is r.ratings and (r.n_users, r.n_items) == (3, 4)


def test_movielens_formats(tmp_path):
    d100 = tmp_path / "ml-100k"
    d100.mkdir()
    (d100 / "u.data").write_text("".join(f"{u}\t{i}\t{int(x) if x == int(x) else x}\t{t}\n" for u, i, x, t in ROWS))
    _check_ratings(loaders.movielens(str(d100 / "u.data")))
    csv = "userId,movieId,rating,timestamp\n" + "".join(f"{u},{i},{float(x)},{t}\n" for u, i, x, t in ROWS)
    (tmp_path / "ratings.csv").write_text(csv)
    _check_ratings(loaders.movielens(str(tmp_path / "ratings.csv")))
    with fsspec.open("memory://ml-25m/ratings.csv.gz", "wb") as f:  # an fsspec URL, compressed
        f.write(gzip.compress(csv.encode()))
    _check_ratings(loaders.movielens("memory://ml-25m/ratings.csv.gz"))
    (tmp_path / "ratings.dat").write_text("".join(f"{u}::{i}::{x}::{t}\n" for u, i, x, t in ROWS))
    _check_ratings(loaders.movielens(str(tmp_path / "ratings.dat")))


def test_uci_bag_of_words(tmp_path):
    # 3 documents, 4 words; docID wordID count (1-based), as in docword.kos.txt
    triples = [(1, 1, 2), (1, 3, 1), (2, 2, 4), (3, 1, 1), (3, 4, 3)]
    text = "3\n4\n5\n" + "".join(f"{d} {w} {c}\n" for d, w, c in triples)
    (tmp_path / "docword.kos.txt").write_text(text)
    (tmp_path / "vocab.kos.txt").write_text("apple\nbanana\ncherry\ndate\n")
    c = loaders.uci_bag_of_words(str(tmp_path / "docword.kos.txt"), str(tmp_path / "vocab.kos.txt"))
    np.testing.assert_array_equal(c.X.toarray(), [[2, 0, 1, 0], [0, 4, 0, 0], [1, 0, 0, 3]])
    assert c.X.dtype == np.int64 and c.vocab == ("apple", "banana", "cherry", "date")
    with gzip.open(tmp_path / "docword.nytimes.txt.gz", "wt") as f:
        f.write(text)
    c2 = loaders.uci_bag_of_words(str(tmp_path / "docword.nytimes.txt.gz"))
    assert (c2.X != c.X).nnz == 0 and c2.vocab == ("0", "1", "2", "3")


def test_svmlight(tmp_path):
    (tmp_path / "a.svm").write_text("1 1:0.5 3:2\n-1 2:1.5\n1 1:1 2:1 3:1\n")
    X, y = loaders.svmlight(str(tmp_path / "a.svm"))
    assert sp.issparse(X)
    np.testing.assert_array_equal(X.toarray(), [[0.5, 0, 2], [0, 1.5, 0], [1, 1, 1]])
    np.testing.assert_array_equal(y, [1, -1, 1])


@pytest.mark.parametrize("name, text, call, match", [
    ("ratings.csv", "a,b,c\n1,2,3\n", loaders.movielens, "expected the header userId"),
    ("u.data", "196\t242\tgood\t1\n", loaders.movielens, "not a table of numbers"),
    ("u.data", "196\t242\n", loaders.movielens, "expected rows of user, item, rating"),
    ("docword.x.txt", "3\n4\n5\n1 1 2\n", loaders.uci_bag_of_words, r"header says 5 .* triples, the file has 1"),
    ("docword.y.txt", "three\n4\n5\n", loaders.uci_bag_of_words, "three header lines"),
    ("docword.z.txt", "1\n2\n1\n1 9 1\n", loaders.uci_bag_of_words, "ids outside"),
    ("b.svm", "1 x:y\n", loaders.svmlight, "not a svmlight"),
])
def test_files_not_in_the_format_are_named(tmp_path, name, text, call, match):
    (tmp_path / name).write_text(text)
    with pytest.raises(InvalidInputError, match=match):
        call(str(tmp_path / name))
    with pytest.raises(InvalidInputError, match="cannot open"):
        call(str(tmp_path / "missing" / name))
