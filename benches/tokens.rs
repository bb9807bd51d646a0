//! The token cost of results. First a short analysis (load and describe a
//! CSV, plot it, answer a question) in three calls, written twice: printing
//! and saving the plot, as agents had to before notebook results, and as
//! notebook cells (last expressions, a figure left open); calls, tokens and
//! images of each, in one run. Then a standard analysis run through the
//! tools over MCP (`/mcp`), as an agent would call them: list and create a sandbox,
//! install pandas, matplotlib and openpyxl (polling the install), upload a
//! CSV, load and describe it with pandas, plot two charts with matplotlib,
//! write an Excel file with openpyxl, delete the sandbox. It runs once on a
//! server with inline images (the defaults) and once on one with
//! `results.inline_images = false` (the baseline), in one run, and prints per
//! call what the model would read: the text items and resource links (bytes,
//! and tokens at about 4 bytes each), the image items (their bytes before
//! base64, and Anthropic's estimate of width × height / 750 tokens each).
//! `structuredContent` repeats the text item and is not counted.
//!
//! `cargo build --release && cargo bench --bench tokens [-- --bin target/release/mcp-sandbox]`
//! (Docker must run and reach the package index; `scripts/bench` provisions
//! Docker).

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::arg;
use common::mcp::{McpClient, Server};
use serde_json::{json, Value};

const PACKAGES: &str = "pandas matplotlib openpyxl";

/// What the model reads of one call.
#[derive(Default, Clone)]
struct Cost {
    tool: String,
    ms: f64,
    text_bytes: usize,
    links: usize,
    images: usize,
    image_bytes: usize,
    image_tokens: usize,
    /// Width × height of each image item.
    sizes: Vec<String>,
}

impl Cost {
    fn text_tokens(&self) -> usize {
        self.text_bytes.div_ceil(4)
    }

    fn tokens(&self) -> usize {
        self.text_tokens() + self.image_tokens
    }

    fn add(&mut self, other: &Cost) {
        self.ms += other.ms;
        self.text_bytes += other.text_bytes;
        self.links += other.links;
        self.images += other.images;
        self.image_bytes += other.image_bytes;
        self.image_tokens += other.image_tokens;
    }
}

/// Measures the content of a tool result; a resource link is read as its
/// name and URI.
fn cost(tool: &str, result: &Value, took: Duration) -> Cost {
    let mut c = Cost {
        tool: tool.into(),
        ms: took.as_secs_f64() * 1000.0,
        ..Cost::default()
    };
    for item in result["content"].as_array().into_iter().flatten() {
        match item["type"].as_str() {
            Some("text") => c.text_bytes += item["text"].as_str().map_or(0, str::len),
            Some("resource_link") => {
                c.links += 1;
                c.text_bytes += item["uri"].as_str().map_or(0, str::len) + item["name"].as_str().map_or(0, str::len);
            }
            Some("image") => {
                let data = base64::engine::general_purpose::STANDARD
                    .decode(item["data"].as_str().unwrap_or_default())
                    .expect("base64 image data");
                let (w, h) = image::ImageReader::new(std::io::Cursor::new(&data))
                    .with_guessed_format()
                    .unwrap()
                    .into_dimensions()
                    .expect("an image item decodes");
                c.images += 1;
                c.image_bytes += data.len();
                c.image_tokens += (w as usize * h as usize).div_ceil(750);
                c.sizes.push(format!("{w}×{h}"));
            }
            other => panic!("unexpected content item {other:?}"),
        }
    }
    c
}

struct Agent<'a> {
    client: &'a McpClient,
    calls: Vec<Cost>,
}

impl Agent<'_> {
    async fn call(&mut self, tool: &str, args: Value) -> Value {
        let t = Instant::now();
        let result = self
            .client
            .try_call(tool, args)
            .await
            .unwrap_or_else(|e| panic!("{tool}: {e:?}"));
        self.calls.push(cost(tool, &result, t.elapsed()));
        result["structuredContent"].clone()
    }

    async fn python(&mut self, sid: &str, code: &str) -> Value {
        let out = self
            .call(
                "execute_python_code",
                json!({"sandbox_id": sid, "code": code, "timeout_seconds": 300}),
            )
            .await;
        assert_eq!(out["exit_code"], 0, "{}", out["stderr"]);
        out
    }
}

/// A year of daily sales in four regions, deterministic.
fn sales_csv() -> String {
    let mut out = String::from("date,region,product,units,unit_price,revenue\n");
    let mut state = 7u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    for day in 0..365u32 {
        let (month, dom) = (day / 31 + 1, day % 28 + 1);
        for region in ["north", "south", "east", "west"] {
            let product = ["A", "B", "C"][(next() % 3) as usize];
            let units = 5 + next() % 50;
            let price = 10.0 + f64::from(next() % 400) / 10.0;
            out.push_str(&format!(
                "2025-{month:02}-{dom:02},{region},{product},{units},{price:.2},{:.2}\n",
                f64::from(units) * price
            ));
        }
    }
    out
}

const DESCRIBE: &str = "import pandas as pd\ndf = pd.read_csv('sales.csv', parse_dates=['date'])\n\
    print(df.shape)\nprint(df.head())\nprint(df.describe())";
const CHART_MONTHLY: &str = "import matplotlib.pyplot as plt\n\
    monthly = df.set_index('date').groupby('region')['revenue'].resample('MS').sum().unstack(0)\n\
    ax = monthly.plot(figsize=(8, 4.5), title='Monthly revenue by region')\nax.set_ylabel('revenue')\n\
    plt.tight_layout()\nplt.savefig('monthly_revenue.png', dpi=120)\nplt.close('all')\nprint('saved')";
const CHART_PRODUCTS: &str = "fig, axes = plt.subplots(1, 2, figsize=(10, 4))\n\
    df.groupby('product')['units'].sum().plot.bar(ax=axes[0], title='Units by product')\n\
    df['unit_price'].plot.hist(ax=axes[1], bins=30, title='Unit price')\n\
    plt.tight_layout()\nplt.savefig('products.png', dpi=150)\nplt.close('all')\nprint('saved')";
const EXCEL: &str = "summary = df.pivot_table(index='region', columns='product', values='revenue', aggfunc='sum')\n\
    with pd.ExcelWriter('summary.xlsx', engine='openpyxl') as w:\n    summary.to_excel(w, sheet_name='revenue')\n\
    df.to_excel(w, sheet_name='data', index=False)\nprint(summary.round(0))";

/// The short analysis (load and describe the CSV, plot it, answer which
/// region earned most) in three calls, written as agents wrote it before
/// notebook results: printing, and saving the plot.
const PRINTED: [&str; 3] = [
    "import pandas as pd\ndf = pd.read_csv('sales.csv', parse_dates=['date'])\nprint(df.shape)\nprint(df.describe())",
    "import matplotlib.pyplot as plt\n\
     monthly = df.set_index('date').groupby('region')['revenue'].resample('MS').sum().unstack(0)\n\
     monthly.plot(figsize=(8, 4.5), title='Monthly revenue by region')\nplt.savefig('monthly.png')\nprint('saved')",
    "print(df.groupby('region')['revenue'].sum().idxmax())",
];

/// The same analysis written as notebook cells: last expressions and a
/// figure left open.
const NOTEBOOK: [&str; 3] = [
    "import pandas as pd\ndf = pd.read_csv('sales.csv', parse_dates=['date'])\ndf.describe()",
    "import matplotlib.pyplot as plt\n\
     monthly = df.set_index('date').groupby('region')['revenue'].resample('MS').sum().unstack(0)\n\
     monthly.plot(figsize=(8, 4.5), title='Monthly revenue by region');",
    "df.groupby('region')['revenue'].sum().idxmax()",
];

/// A sandbox with the packages and the CSV, its calls counted in `a`.
async fn prepared(a: &mut Agent<'_>, uploads: &std::path::Path) -> String {
    let sid = a.call("create_sandbox", json!({"name": "analysis"})).await["sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();
    let args = json!({"sandbox_id": sid, "package_name": PACKAGES});
    let mut status = a.call("install_package_in_sandbox", args.clone()).await["status"].clone();
    while status == "installing" {
        tokio::time::sleep(Duration::from_secs(3)).await;
        status = a.call("check_package_installation_status", args.clone()).await["status"].clone();
    }
    assert_eq!(status, "success");
    let csv = uploads.join("sales.csv");
    a.call(
        "upload_file_to_sandbox",
        json!({"sandbox_id": sid, "local_file_path": csv.display().to_string()}),
    )
    .await;
    sid
}

/// The three calls of the short analysis, written as `cells`, on the
/// server at `base`; the cost of each.
async fn short_analysis(base: &str, uploads: &std::path::Path, cells: [&str; 3]) -> Vec<Cost> {
    let client = McpClient::http(reqwest::Client::new(), base).await;
    let mut a = Agent {
        client: &client,
        calls: vec![],
    };
    let sid = prepared(&mut a, uploads).await;
    a.calls.clear();
    let mut answers = vec![];
    for cell in cells {
        let out = a.python(&sid, cell).await;
        answers.push(out);
    }
    let answer = answers[2]["stdout"].as_str().unwrap_or_default().trim().to_string();
    let value = answers[2]["outputs"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .trim_matches('\'');
    assert!(
        !answer.is_empty() || !value.is_empty(),
        "the question is answered: {}",
        answers[2]
    );
    let calls = a.calls.clone();
    a.call("delete_sandbox", json!({"sandbox_id": sid})).await;
    calls
}

/// The analysis on the server at `base`; the cost of every call.
async fn analysis(base: &str, uploads: &std::path::Path) -> Vec<Cost> {
    let client = McpClient::http(reqwest::Client::new(), base).await;
    let mut a = Agent {
        client: &client,
        calls: vec![],
    };
    a.call("list_sandboxes", json!({})).await;
    let sid = prepared(&mut a, uploads).await;
    a.python(&sid, DESCRIBE).await;
    for chart in [CHART_MONTHLY, CHART_PRODUCTS] {
        let out = a.python(&sid, chart).await;
        assert_eq!(out["files"].as_array().map(Vec::len), Some(1), "{out}");
    }
    a.python(&sid, EXCEL).await;
    a.call("delete_sandbox", json!({"sandbox_id": sid})).await;
    a.calls
}

fn table(title: &str, calls: &[Cost]) -> Cost {
    println!("\n{title}\n");
    println!("| # | tool | ms | text B | links | images | px | image B | image tokens | tokens |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut total = Cost {
        tool: "total".into(),
        ..Cost::default()
    };
    for (i, c) in calls.iter().enumerate() {
        println!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            c.tool,
            c.ms,
            c.text_bytes,
            c.links,
            c.images,
            c.sizes.join(", "),
            c.image_bytes,
            c.image_tokens,
            c.tokens()
        );
        total.add(c);
    }
    println!(
        "| | {} calls | {:.0} | {} | {} | {} | | {} | {} | {} |",
        calls.len(),
        total.ms,
        total.text_bytes,
        total.links,
        total.images,
        total.image_bytes,
        total.image_tokens,
        total.tokens()
    );
    total
}

#[tokio::main]
async fn main() {
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let uploads = tempfile::tempdir().unwrap();
    std::fs::write(uploads.path().join("sales.csv"), sales_csv()).unwrap();
    let mut env = vec![
        ("MCP_SANDBOX_POOL_MIN", "0".to_string()),
        ("MCP_SANDBOX_POOL_MAX", "0".to_string()),
        (
            "MCP_SANDBOX_UPLOADS_ALLOWED_DIRS",
            format!("[{:?}]", uploads.path().display().to_string()),
        ),
    ];
    let ca = std::path::Path::new("/etc/ssl/certs/ca-certificates.crt");
    if ca.is_file() {
        env.push(("MCP_SANDBOX_SANDBOX_CA_BUNDLE", ca.display().to_string()));
    }
    let mut runs = vec![];
    let mut short = vec![];
    for inline in [true, false] {
        let mut env = env.clone();
        env.push(("MCP_SANDBOX_RESULTS_INLINE_IMAGES", inline.to_string()));
        let server = Server::start(&bin, &env).await;
        runs.push(analysis(&server.base, uploads.path()).await);
        if inline {
            for cells in [PRINTED, NOTEBOOK] {
                short.push(short_analysis(&server.base, uploads.path(), cells).await);
            }
        }
    }
    let printed = table("the short analysis in 3 calls, printing and saving the plot", &short[0]);
    let notebook = table(
        "the short analysis in 3 calls, as notebook cells (last expressions, a figure left open)",
        &short[1],
    );
    println!(
        "\nnotebook cells: {} calls, {} tokens ({} text, {} in {} images) against {} calls, {} tokens ({} text, {} in {} images) printing: {:.2} ×",
        short[1].len(),
        notebook.tokens(),
        notebook.text_tokens(),
        notebook.image_tokens,
        notebook.images,
        short[0].len(),
        printed.tokens(),
        printed.text_tokens(),
        printed.image_tokens,
        printed.images,
        notebook.tokens() as f64 / printed.tokens() as f64
    );
    let with = table(
        "with inline images (defaults: 64 KiB each, 192 KiB a result, 3 a result)",
        &runs[0],
    );
    let without = table("baseline: results.inline_images = false", &runs[1]);
    println!(
        "\ninline images add {} image items, {} bytes ({} base64), {} tokens: {} tokens in all against {} ({:.2} ×)",
        with.images,
        with.image_bytes,
        with.image_bytes.div_ceil(3) * 4,
        with.image_tokens,
        with.tokens(),
        without.tokens(),
        with.tokens() as f64 / without.tokens() as f64
    );
}
