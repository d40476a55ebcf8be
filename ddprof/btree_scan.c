/* Scan one rowid table of an SQLite file straight from its B-tree pages into int64 columns.
 *
 * Why: an export's big tables (a million NVTX ranges, kernels and runtime calls each) cost about
 * 150 ns a row through SQLite's API (its virtual machine decodes every row and column); their
 * pages decode here in a fraction of that. The format is SQLite's documented, stable one
 * (https://www.sqlite.org/fileformat2.html): table B-tree pages, varints, records, overflow chains.
 *
 * The file is mapped read-only by the caller. Every page number, offset and length read from it
 * is checked before use, so a damaged file gives an error message, never a crash or a wrong row:
 * the checks are the main job of this code. No libc: it builds with any C compiler and -nostdlib.
 *
 * Column modes: INT reads an integer column (NULL reads as 0; a real, text or blob value is an
 * error); ANY accepts any value; REAL reads a number as a double (its bits in the int64 output);
 * TEXT reads a text column as codes into a dictionary of its distinct values, which the caller
 * decodes once each: a million rows that name a few dozen ranges cost a hash each, never a
 * string each. Per column the caller asks for its values, whether each is present (not NULL), or
 * both (a NULL output pointer skips one). Column index -1 is the rowid (an INTEGER PRIMARY KEY
 * column is stored as NULL in the record and means it too).
 */

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned char u8;

enum { MODE_INT = 0, MODE_ANY = 1, MODE_REAL = 2, MODE_TEXT = 3 };
enum { DICTIONARY_FULL = -2 };  /* scan_table's answer when the dictionary's bytes ran out */
enum { LEAF_TABLE = 13, INTERIOR_TABLE = 5, MAX_DEPTH = 64, MAX_COLUMNS = 64 };

struct scan {
    const u8 *file;
    i64 n_pages;
    i64 page_size;
    i64 usable;           /* page size less the reserved bytes at the end of each page */
    i64 pages_visited;    /* a B-tree visits each page once; more means a cycle */
    char *err;
    int err_size;
};

static int fail(struct scan *s, const char *what, i64 number) {
    /* Message "what" followed by a decimal number when number >= 0. */
    int n = 0;
    while (what[n] && n < s->err_size - 24) { s->err[n] = what[n]; n++; }
    if (number >= 0) {
        char digits[24];
        int d = 0;
        s->err[n++] = ' ';
        do { digits[d++] = (char)('0' + number % 10); number /= 10; } while (number);
        while (d) s->err[n++] = digits[--d];
    }
    s->err[n] = 0;
    return -1;
}

/* The distinct values of a scan's text columns. Entry k's bytes are bytes[offsets[k], offsets[k+1]);
 * slots is an open-addressing hash table of entry + 1 (0: empty), with more slots than entries can
 * be made (twice as many keeps probes short), so that a probe always ends. The caller sizes it all. */
struct dictionary {
    i64 *slots;
    i64 n_slots;          /* a power of two */
    i64 *offsets;         /* max_entries + 1 of them; offsets[0] = 0 */
    i64 max_entries;
    u8 *bytes;
    i64 bytes_size;
    i64 entries;          /* in and out: entries made so far */
};

static u64 big_endian(const u8 *p, int bytes) {
    u64 v = 0;
    for (int i = 0; i < bytes; i++) v = (v << 8) | p[i];
    return v;
}

/* A varint at p (at most 9 bytes, never past end); returns its length, 0 when it runs past end. */
static int varint(const u8 *p, const u8 *end, u64 *out) {
    u64 v = 0;
    for (int i = 0; i < 9; i++) {
        if (p + i >= end) return 0;
        if (i == 8) { *out = (v << 8) | p[i]; return 9; }
        v = (v << 7) | (p[i] & 0x7f);
        if (!(p[i] & 0x80)) { *out = v; return i + 1; }
    }
    return 0;
}

static const u8 *page_at(struct scan *s, u64 number) {
    if (number < 1 || (i64)number > s->n_pages) return 0;
    return s->file + (i64)(number - 1) * s->page_size;
}

/* Copy payload bytes [from, to) of a cell whose first `local` bytes lie at `here` and the rest in
 * the overflow chain starting at page `overflow`. */
static int payload_bytes(struct scan *s, const u8 *here, i64 local, u64 overflow, i64 from, i64 to, u8 *dst) {
    i64 at = 0;                       /* payload offset of the current piece */
    const u8 *piece = here;
    i64 piece_len = local;
    i64 hops = 0;
    while (from < to) {
        if (from < at + piece_len) {
            i64 n = (to < at + piece_len ? to : at + piece_len) - from;
            for (i64 i = 0; i < n; i++) dst[from + i] = piece[from - at + i];
            from += n;
            continue;
        }
        const u8 *page = page_at(s, overflow);
        if (!page || ++hops > s->n_pages) return fail(s, "broken overflow chain at page", (i64)overflow);
        at += piece_len;
        overflow = big_endian(page, 4);
        piece = page + 4;
        piece_len = s->usable - 4;
    }
    return 0;
}

/* The code of text `p[0, n)` in the dictionary, made when new; DICTIONARY_FULL when its bytes are out. */
static i64 intern(struct dictionary *d, const u8 *p, i64 n) {
    u64 hash = 14695981039346656037ull;          /* FNV-1a */
    for (i64 i = 0; i < n; i++) hash = (hash ^ p[i]) * 1099511628211ull;
    u64 mask = (u64)d->n_slots - 1;
    for (u64 slot = hash & mask;; slot = (slot + 1) & mask) {
        i64 entry = d->slots[slot] - 1;
        if (entry < 0) break;
        const u8 *known = d->bytes + d->offsets[entry];
        if (d->offsets[entry + 1] - d->offsets[entry] != n) continue;
        i64 i = 0;
        while (i < n && known[i] == p[i]) i++;
        if (i == n) return entry;
    }
    i64 at = d->offsets[d->entries];
    if (d->entries >= d->max_entries || n > d->bytes_size - at) return DICTIONARY_FULL;
    for (i64 i = 0; i < n; i++) d->bytes[at + i] = p[i];
    for (u64 slot = hash & mask;; slot = (slot + 1) & mask) {
        if (!d->slots[slot]) { d->slots[slot] = d->entries + 1; break; }
    }
    d->offsets[d->entries + 1] = at + n;
    return d->entries++;
}

struct columns {
    int n;
    const int *index;     /* record column, or -1 for the rowid */
    const int *mode;
    int last;             /* highest record column asked for */
    i64 capacity;
    i64 **values;         /* NULL while counting; values[j] NULL: not asked for */
    u8 **present;         /* present[j] NULL: not asked for */
    u8 *scratch;          /* payload bytes of a row that spills into overflow pages */
    i64 scratch_size;
    struct dictionary *texts;  /* where MODE_TEXT columns put their values */
};

/* Decode one leaf cell into row `row` of the output columns. */
static int read_cell(struct scan *s, const u8 *cell, const u8 *page_end, struct columns *c, i64 row, u64 page_no) {
    u64 size, rowid;
    int n = varint(cell, page_end, &size);
    int m = n ? varint(cell + n, page_end, &rowid) : 0;
    if (!m) return fail(s, "cell runs past the end of page", (i64)page_no);
    const u8 *payload = cell + n + m;
    i64 max_local = s->usable - 35, local = (i64)size;
    if ((i64)size > max_local) {  /* the spill rule of the file format */
        i64 min_local = (s->usable - 12) * 32 / 255 - 23;
        local = min_local + ((i64)size - min_local) % (s->usable - 4);
        if (local > max_local) local = min_local;
    }
    if (payload + local + (local < (i64)size ? 4 : 0) > page_end)
        return fail(s, "cell runs past the end of page", (i64)page_no);

    const u8 *record = payload;
    i64 available = local;        /* bytes of the record readable at `record` */
    u64 overflow = local < (i64)size ? big_endian(payload + local, 4) : 0;
    u64 header_size;
    int h;
    if (local < (i64)size) {      /* rare: gather what is needed into scratch */
        i64 head = (i64)size < 9 ? (i64)size : 9;
        if (payload_bytes(s, payload, local, overflow, 0, head, c->scratch)) return -1;
        h = varint(c->scratch, c->scratch + head, &header_size);
        if (!h || (i64)header_size > (i64)size) return fail(s, "bad record header in page", (i64)page_no);
        if ((i64)header_size > c->scratch_size) return fail(s, "record header too large in page", (i64)page_no);
        if (payload_bytes(s, payload, local, overflow, head < (i64)header_size ? head : (i64)header_size,
                          (i64)header_size, c->scratch)) return -1;
        record = c->scratch;
        available = (i64)header_size;
    } else {
        h = varint(record, record + available, &header_size);
        if (!h || (i64)header_size > available) return fail(s, "bad record header in page", (i64)page_no);
    }

    /* Walk the serial types up to the last column asked for: each column's type and body offset. */
    u64 type[MAX_COLUMNS];
    i64 offset[MAX_COLUMNS];
    i64 body = (i64)header_size;
    const u8 *p = record + h, *header_end = record + header_size;
    int columns = 0;
    while (columns <= c->last && p < header_end) {
        int k = varint(p, header_end, &type[columns]);
        if (!k) return fail(s, "bad record header in page", (i64)page_no);
        static const u8 int_bytes[10] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0};
        u64 t = type[columns];
        u64 length = t < 10 ? int_bytes[t] : t >= 12 ? (t - 12) / 2 : 0;
        if (length > size) return fail(s, "record longer than its cell in page", (i64)page_no);
        offset[columns] = body;     /* the sum stays below 65 cell sizes: no overflow */
        body += (i64)length;
        p += k;
        columns++;
    }
    if (body > (i64)size) return fail(s, "record longer than its cell in page", (i64)page_no);
    if (local < (i64)size) {      /* bring the bodies of the asked columns into scratch too */
        if (body > c->scratch_size) return fail(s, "row too large to read in page", (i64)page_no);
        if (payload_bytes(s, payload, local, overflow, (i64)header_size, body, c->scratch)) return -1;
        available = body;
    }

    for (int j = 0; j < c->n; j++) {
        int col = c->index[j];
        u64 t = col >= 0 && col < columns ? type[col] : 0;   /* absent: added later by ALTER TABLE */
        int mode = c->mode[j];
        i64 v = 0;
        if (col < 0) {
            v = (i64)rowid;
            t = 1;
        } else if ((t >= 1 && t <= 7) || (t >= 12 && mode == MODE_TEXT)) {
            static const u8 bytes[8] = {0, 1, 2, 3, 4, 6, 8, 8};
            i64 b = t <= 7 ? bytes[t] : (i64)((t - 12) / 2);
            if (offset[col] + b > available) return fail(s, "value past the end of its record in page", (i64)page_no);
            if (t >= 12) {
                if (!(t & 1)) return fail(s, "blob in a text column at rowid", (i64)rowid);
                if (c->values[j]) {   /* presence alone: nothing to intern */
                    v = intern(c->texts, record + offset[col], b);
                    if (v < 0) return (int)v;
                }
            } else if (t < 7) {
                u64 raw = big_endian(record + offset[col], (int)b);
                int shift = 64 - 8 * (int)b;
                v = shift ? (i64)(raw << shift) >> shift : (i64)raw;     /* sign-extend */
            } else {
                v = (i64)big_endian(record + offset[col], 8);           /* a double's bits */
            }
        } else if (t == 8 || t == 9) {
            v = (i64)t - 8;
        }
        if (t != 0 && mode != MODE_ANY) {
            int integer = t <= 6 || t == 8 || t == 9;
            if (mode == MODE_INT && !integer)
                return fail(s, "non-integer value in an integer column at rowid", (i64)rowid);
            if (mode == MODE_REAL && !integer && t != 7)
                return fail(s, "non-numeric value in a real column at rowid", (i64)rowid);
            if (mode == MODE_TEXT && t < 12) return fail(s, "non-text value in a text column at rowid", (i64)rowid);
            if (mode == MODE_REAL && integer) {
                union { double d; i64 bits; } real = {(double)v};
                v = real.bits;
            }
        }
        if (c->values[j]) c->values[j][row] = v;
        if (c->present[j]) c->present[j][row] = t != 0;
    }
    return 0;
}

/* Walk the table B-tree rooted at `root` in rowid order; returns the number of rows, -1 (err says
 * why) or DICTIONARY_FULL (call again with more dictionary bytes). */
i64 scan_table(const u8 *file, i64 file_size, i64 page_size, i64 reserved, i64 root,
               int n_columns, const int *index, const int *mode, i64 capacity,
               i64 **values, u8 **present, u8 *scratch, i64 scratch_size, struct dictionary *texts,
               char *err, int err_size) {
    struct scan s = {file, 0, page_size, page_size - reserved, 0, err, err_size};
    struct columns c = {n_columns, index, mode, -1, capacity, values, present, scratch, scratch_size, texts};
    if (page_size < 512 || s.usable < 480) return fail(&s, "unsupported page size", page_size);
    s.n_pages = file_size / page_size;
    if (n_columns > MAX_COLUMNS) return fail(&s, "too many columns:", n_columns);
    for (int j = 0; j < n_columns; j++) {
        if (mode[j] == MODE_TEXT && values && values[j] &&
            (!texts || texts->n_slots <= texts->max_entries || texts->n_slots & (texts->n_slots - 1)))
            return fail(&s, "a text column needs a dictionary with more slots (a power of two) than entries", -1);
        if (index[j] >= MAX_COLUMNS) return fail(&s, "column index too large:", index[j]);
        if (index[j] > c.last) c.last = index[j];
    }

    u64 stack_page[MAX_DEPTH];
    i64 stack_next[MAX_DEPTH];    /* next cell to descend into; n_cells means the right-most child */
    int depth = 0;
    i64 rows = 0;
    stack_page[0] = (u64)root;
    stack_next[0] = -1;
    while (depth >= 0) {
        u64 number = stack_page[depth];
        const u8 *page = page_at(&s, number);
        if (!page) return fail(&s, "page number out of range:", (i64)number);
        const u8 *header = page + (number == 1 ? 100 : 0);
        const u8 *page_end = page + s.usable;
        i64 n_cells = (i64)big_endian(header + 3, 2);
        if (stack_next[depth] < 0) {  /* first visit */
            if (++s.pages_visited > s.n_pages) return fail(&s, "B-tree cycle at page", (i64)number);
            stack_next[depth] = 0;
        }
        if (header[0] == LEAF_TABLE) {
            const u8 *pointers = header + 8;
            if (pointers + 2 * n_cells > page_end) return fail(&s, "too many cells in page", (i64)number);
            if (!values) {            /* counting: the cells are checked when they are read */
                rows += n_cells;
                depth--;
                continue;
            }
            for (i64 i = 0; i < n_cells; i++) {
                i64 at = (i64)big_endian(pointers + 2 * i, 2);
                if (at < pointers + 2 * n_cells - page || page + at >= page_end)
                    return fail(&s, "cell pointer out of page", (i64)number);
                if (rows >= capacity) return fail(&s, "more rows than counted in page", (i64)number);
                int failed = read_cell(&s, page + at, page_end, &c, rows, number);
                if (failed) return failed;
                rows++;
            }
            depth--;
        } else if (header[0] == INTERIOR_TABLE) {
            const u8 *pointers = header + 12;
            if (pointers + 2 * n_cells > page_end) return fail(&s, "too many cells in page", (i64)number);
            i64 next = stack_next[depth]++;
            u64 child;
            if (next < n_cells) {
                i64 at = (i64)big_endian(pointers + 2 * next, 2);
                if (at < pointers + 2 * n_cells - page || page + at + 4 > page_end)
                    return fail(&s, "cell pointer out of page", (i64)number);
                child = big_endian(page + at, 4);
            } else if (next == n_cells) {
                child = big_endian(header + 8, 4);
            } else {
                depth--;
                continue;
            }
            if (depth + 1 >= MAX_DEPTH) return fail(&s, "B-tree too deep at page", (i64)number);
            depth++;
            stack_page[depth] = child;
            stack_next[depth] = -1;
        } else {
            return fail(&s, "not a table B-tree page:", (i64)number);
        }
    }
    return rows;
}
