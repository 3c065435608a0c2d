//! A crawl's site graph, made up and deterministic: pages over sites of
//! uneven sizes, each page linking a few more, mostly of its own site.
//! Shared by `tests/frontier_discovery.rs` and the loadtest's discovery
//! scenario (`examples/loadtest/discovery_scenario.rs`).
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

/// A page: its site, and its number within the site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Page {
    pub site: usize,
    pub index: usize,
}

/// Pages over sites, and the links each page gives.
#[derive(Debug)]
pub struct SiteGraph {
    /// Pages per site.
    sizes: Vec<usize>,
    /// The id of each site's first page (ids run site by site).
    first: Vec<usize>,
    links: Vec<Vec<usize>>,
}

impl SiteGraph {
    /// `pages` over `sites` sites, sized from half the mean to one and a
    /// half times it; page `i` of a site links its page `i + 1` (so every
    /// page is reachable from its site's first), `own_links − 1` more of
    /// its site's pages drawn at random, and one page of another site.
    pub fn new(sites: usize, pages: usize, own_links: usize, seed: u64) -> Self {
        assert!(
            sites >= 2 && pages >= 2 * sites,
            "at least two sites of two pages"
        );
        let mean = pages as f64 / sites as f64;
        let mut sizes: Vec<usize> = (0..sites)
            .map(|site| (mean / 2.0 + mean * site as f64 / (sites - 1) as f64).round() as usize)
            .collect();
        // Rounding: the first sites (the smallest) take up the difference.
        let mut total: usize = sizes.iter().sum();
        let mut site = 0;
        while total != pages {
            if total < pages {
                sizes[site] += 1;
                total += 1;
            } else if sizes[site] > 2 {
                sizes[site] -= 1;
                total -= 1;
            }
            site = (site + 1) % sites;
        }
        let first: Vec<usize> = sizes
            .iter()
            .scan(0, |next, &size| {
                let first = *next;
                *next += size;
                Some(first)
            })
            .collect();
        let mut random = Lcg(seed.wrapping_mul(2) + 1);
        let mut links = Vec::with_capacity(pages);
        for site in 0..sites {
            let size = sizes[site];
            for index in 0..size {
                let mut page_links = Vec::with_capacity(own_links + 1);
                if index + 1 < size {
                    page_links.push(first[site] + index + 1);
                }
                while page_links.len() < own_links {
                    page_links.push(first[site] + random.below(size));
                }
                let other = (site + 1 + random.below(sites - 1)) % sites;
                page_links.push(first[other] + random.below(sizes[other]));
                links.push(page_links);
            }
        }
        SiteGraph { sizes, first, links }
    }

    /// Every page.
    pub fn pages(&self) -> usize {
        self.links.len()
    }

    /// How many sites.
    pub fn sites(&self) -> usize {
        self.sizes.len()
    }

    /// The most pages a site has.
    pub fn busiest(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// How long the busiest site's pages take at one every `delay`: no
    /// crawl of the whole graph can be faster.
    pub fn bound(&self, delay: Duration) -> Duration {
        delay * u32::try_from(self.busiest()).expect("fewer than 2³² pages")
    }

    /// The site and number of page `id`.
    pub fn page(&self, id: usize) -> Page {
        let site = self.first.partition_point(|&first| first <= id) - 1;
        Page {
            site,
            index: id - self.first[site],
        }
    }

    /// The pages page `id` links.
    pub fn links(&self, id: usize) -> &[usize] {
        &self.links[id]
    }

    /// Each site's first page: the crawl's seeds.
    pub fn seeds(&self) -> Vec<usize> {
        self.first.clone()
    }

    /// A number for page `id` whose remainder by the number of sites is
    /// its site (the loadtest matches departures and arrivals by it).
    pub fn seq(&self, id: usize) -> u32 {
        let page = self.page(id);
        u32::try_from(page.index * self.sites() + page.site).expect("fewer than 2³² pages")
    }
}

/// A small linear congruential generator: the graph is the same on every
/// machine, with no dependency.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % bound as u64) as usize
    }
}
